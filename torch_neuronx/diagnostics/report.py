"""The Trainium-readiness report: a verdict, what a real NeuronCore would do differently at each
source line, an estimate of the time it would take there, and what ran. ``torch_neuronx.report()``
builds one; ``to_json`` writes it with ``schema_version`` (raise it when a key changes meaning or
goes away).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch

from torch_neuronx.diagnostics import findings, observer, op_tracking, places
from torch_neuronx.diagnostics.rows import (CompiledGraphRow, FamilyRow, FindingRow, MemoryRow, PhaseRow, SignatureRow,
                                            SourceRow, Verdict)
from torch_neuronx.trainium import cost_model, neff_forecast, time_model
from torch_neuronx.trainium.cost_model import TensorMeta
from torch_neuronx.python_ops import op_classes
from torch_neuronx.python_ops.op_classes import HOST_TRANSFER, NOT_ESTIMATED
from torch_neuronx.runtime import BACKEND_NAME, format_bytes, hardware
from torch_neuronx.runtime.rows import Row, rows_of
from torch_neuronx.runtime.units import format_seconds, seconds_estimate, seconds_range

# 3: a warm run's one estimate with its interval (the time model's out-of-sample error);
# 2: the NEFF forecast, first-run and steady-state ranges, launches per phase
SCHEMA_VERSION = 3
TIMELINE_POINTS = 400


@dataclass
class Report(Row):
    """What the JSON holds, in the order the text and HTML show it."""

    schema_version: int
    verdict: Verdict | None  # the report's first line and its counts (None until the findings are in)
    process: str  # "pid N", with the rank under torch.distributed
    profile: cost_model.TrainiumProfile
    collected: bool
    findings: list[FindingRow]  # one row per source line and kind, worst first (see places.rows)
    sources: list[SourceRow]  # the footnotes findings cite by id: name and url
    estimated_ms: float  # the roofline time of the run's calls
    steady_state_seconds: float  # a warm run on Trainium: roofline + launches, the estimate
    steady_state_interval_seconds: tuple[float, float]  # where the time model's held-out error puts it
    first_run_seconds: tuple[float, float]  # a cold run: every NEFF compiled (a range), then a warm run
    phases: list[PhaseRow]
    families: list[FamilyRow]
    signatures: list[SignatureRow]
    compiled_graphs: list[CompiledGraphRow]
    neffs: list[neff_forecast.Neff]  # the NEFF forecast: what a first run compiles, most launched first
    host_syncs: int  # host<->device copies and .item() calls
    executed_ops: dict[str, int]
    fallback_ops: dict[str, int]
    memory: list[MemoryRow]
    memory_timeline: list[tuple[float, int]]  # (seconds since the first neuron allocation, bytes allocated)
    memory_timeline_device: str
    assumptions: list[str] = field(default_factory=list)

    stem: ClassVar[str] = "report"  # its files: report.txt, report.json, ... (runtime.outputs.write)
    nested = {"verdict": Verdict.from_dict, "profile": lambda d: cost_model.TrainiumProfile(**d),
              "findings": rows_of(FindingRow), "sources": rows_of(SourceRow),
              "steady_state_interval_seconds": tuple, "first_run_seconds": tuple, "phases": rows_of(PhaseRow),
              "families": rows_of(FamilyRow), "signatures": rows_of(SignatureRow),
              "compiled_graphs": rows_of(CompiledGraphRow),
              "neffs": lambda items: [neff_forecast.Neff(**n) for n in items], "memory": rows_of(MemoryRow),
              "memory_timeline": lambda points: [tuple(p) for p in points]}

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def text(self) -> str:
        from torch_neuronx.diagnostics import text

        return text.render(self)

    def html(self) -> str:
        from torch_neuronx.diagnostics import html

        return html.render(self)

    def __str__(self) -> str:
        return self.text()


def graph_kind(graph) -> str:
    """A compiled graph's kind (forward, backward, inference), when the compiler said."""
    return getattr(graph, "kind", None) or "compiled graph"


def _call_family(signature: observer.Signature, results: tuple[TensorMeta, ...]) -> str:
    base = op_classes.base_name(signature.op)
    if base in ("copy", "_to_copy") and (any(m.device != BACKEND_NAME for m in signature.inputs) or not results):
        return HOST_TRANSFER
    return signature.family


def _family_rows(costs: list[tuple[str, int, cost_model.OpCost]]) -> list[FamilyRow]:
    """(family, calls, cost per call) -> one row per family, slowest first."""
    rows: dict[str, FamilyRow] = {}
    compute_s: Counter = Counter()
    for fam, calls, cost in costs:
        row = rows.setdefault(fam, FamilyRow(fam, 0, 0, 0, 0.0, ""))
        row.calls += calls
        row.flops += cost.flops * calls
        row.bytes += cost.bytes * calls
        if fam not in NOT_ESTIMATED:
            row.estimated_ms += cost.seconds * calls * 1e3
            if cost.bound == "compute":
                compute_s[fam] += cost.seconds * calls
    for row in rows.values():
        if row.family in NOT_ESTIMATED:
            row.bound = "not estimated"
        else:
            row.bound = "compute" if compute_s[row.family] * 1e3 > row.estimated_ms / 2 else "memory"
    return sorted(rows.values(), key=lambda r: (-r.estimated_ms, r.family))


def _downsample(points: list[tuple[float, int]], limit: int) -> list[tuple[float, int]]:
    if len(points) <= limit:
        return list(points)
    step = len(points) / limit
    out = []
    for i in range(limit):  # keep each bucket's peak, so the plot shows the real maximum
        bucket = points[int(i * step): int((i + 1) * step)] or points[-1:]
        out.append(max(bucket, key=lambda p: p[1]))
    return out


def _process() -> str:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    return f"pid {os.getpid()}" + (f", rank {rank} of {world}" if rank is not None and world else "")


def _memory_rows() -> list[MemoryRow]:
    rows = []
    if not torch.neuron.is_initialized():
        return rows
    for index in range(torch.neuron.device_count()):
        peak = torch.neuron.max_memory_allocated(index)
        if peak or index == torch.neuron.current_device():  # the devices this process used
            rows.append(MemoryRow(f"neuron:{index}", peak, torch.neuron.get_device_properties(index).total_memory))
    return rows


def _memory_findings(rows: list[MemoryRow], profile: cost_model.TrainiumProfile) -> list[findings.Finding]:
    # The HBM of one logical core of the profile's chip (not the emulated capacity, which users can raise).
    hbm = hardware.CHIPS[profile.chip].core_memory(profile.lnc)
    out = []
    for row in rows:
        if row.peak_bytes > hbm:
            out.append(findings.Finding("memory", "-", row.device, 1,
                                        f"peak {format_bytes(row.peak_bytes)} exceeds the {format_bytes(hbm)} a core "
                                        "has: this would run out of memory"))
        elif row.peak_bytes > 0.8 * hbm:
            out.append(findings.Finding("memory-headroom", "-", row.device, 1,
                                        f"peak {format_bytes(row.peak_bytes)} is over 80% of the core's "
                                        f"{format_bytes(hbm)}"))
    return out


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def verdict(report: Report) -> Verdict:
    """The report's first line: how many places would fail, compute differently or run slowly on
    Trainium, and the estimated time."""
    counts = places.places_by_severity(report.findings)
    fail, differ, slow, limit = (counts[k] for k in ("would-fail", "computes-differently", "runs-slowly",
                                                     "near-limit"))
    status = "not ready" if fail else "ready with changes" if differ or slow or limit else "ready"
    where = (f"{_plural(fail, 'place would', 'places would')} fail on Trainium, "
             f"{_plural(differ, 'computes', 'compute')} differently, {_plural(slow, 'runs', 'run')} slowly"
             + (f", {_plural(limit, 'is', 'are')} near a limit" if limit else ""))
    profile = report.profile
    neffs = len(report.neffs)
    if report.collected:
        estimate = (f"estimated on {profile.chip} at LNC={profile.lnc}: a first run of "
                    f"{seconds_range(report.first_run_seconds)} ({_plural(neffs, 'NEFF', 'NEFFs')} to compile), then "
                    f"{seconds_estimate(report.steady_state_seconds, report.steady_state_interval_seconds)} per run "
                    f"({_plural(_launches(report), 'launch', 'launches')}"
                    f"; roofline {format_seconds(report.estimated_ms / 1e3)}); an estimate, not a measurement")
    else:
        status = "not checked"
        estimate = "calls were not observed, so there is no estimate and only memory was checked"
    return Verdict(status, counts, report.estimated_ms, neffs, list(report.first_run_seconds),
                   report.steady_state_seconds, list(report.steady_state_interval_seconds),
                   f"Verdict ({status}): {where}; {estimate}.")


def _launches(report: Report) -> int:
    return sum(n.launches for n in report.neffs)


def _from_first_allocation(timeline: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The samples from the first one with neuron memory allocated, timed from it (what came before,
    imports and setup, is a flat line at zero)."""
    first = next((i for i, (_, allocated) in enumerate(timeline) if allocated > 0), None)
    if first is None:
        return []
    start = timeline[first][0]
    return [(t - start, allocated) for t, allocated in timeline[first:]]


def _with_findings(report: Report, found: list[findings.Finding]) -> Report:
    report.findings, report.sources = places.rows(found)
    report.verdict = verdict(report)
    return report


def build(profile: cost_model.TrainiumProfile | str | None = None) -> Report:
    """The report of what was collected so far (see :func:`torch_neuronx.diagnostics.start`)."""
    if isinstance(profile, str):
        profile = cost_model.parse_profile(profile)
    profile = profile or cost_model.current_profile()
    collector = observer.active() or observer.last()
    if collector is observer.active() and collector is not None:
        collector.switch_phase(collector.phase.name)  # bring the current phase's wall time up to date
    report = _counted(profile, collector is not None)
    found = _memory_findings(report.memory, profile)
    if collector is None:
        report.assumptions.insert(0, "Calls were not observed: only op counts and memory are reported. Set "
                                     "TORCH_NEURONX_REPORT=1, run under `python -m torch_neuronx.run`, or call "
                                     "torch_neuronx.diagnostics.start() first.")
        return _with_findings(report, found)
    with collector.lock:
        phases = [(p.name, p.seconds, dict(p.calls), dict(p.graph_calls)) for p in collector.phases.values()]
        results = dict(collector.results)
        graphs = dict(collector.graphs)
        timeline = list(collector.timeline)
    _add_estimate(report, profile, phases, results, graphs)
    found = collector.detector.collected() + findings.compile_findings(collector.earlier_compilations) + found
    report.memory_timeline = _downsample(_from_first_allocation(timeline), TIMELINE_POINTS)
    return _with_findings(report, found)


@dataclass(frozen=True)
class Mark:
    """A point of a collection: what was found before it (see :func:`findings_since`)."""

    findings: dict
    compilations: list


def mark() -> Mark:
    """The current point of the active collection (one test's start, say)."""
    from torch._dynamo.utils import get_compilation_metrics

    collector = observer.active()
    if collector is None:
        raise RuntimeError("not collecting: call torch_neuronx.diagnostics.start() first")
    return Mark(collector.detector.counts(), collector.earlier_compilations + get_compilation_metrics())


def findings_since(since: Mark) -> list[FindingRow]:
    """The report's findings rows of what was found after ``since`` (memory aside: a peak belongs to
    the whole process)."""
    collector = observer.active()
    if collector is None:
        raise RuntimeError("not collecting: call torch_neuronx.diagnostics.start() first")
    found = collector.detector.collected(since.findings) + findings.compile_findings(since.compilations)
    return places.rows(found)[0]


def _counted(profile: cost_model.TrainiumProfile, collected: bool) -> Report:
    """The parts of the report that need no observation: op counts, memory peaks, assumptions."""
    executed = op_tracking.get_op_counts()
    timeline_device = f"{BACKEND_NAME}:{torch.neuron.current_device()}" if torch.neuron.is_initialized() else ""
    return Report(schema_version=SCHEMA_VERSION, verdict=None, process=_process(), profile=profile,
                  collected=collected, findings=[], sources=[], estimated_ms=0.0, steady_state_seconds=0.0,
                  steady_state_interval_seconds=(0.0, 0.0),
                  first_run_seconds=(0.0, 0.0), phases=[], families=[], signatures=[], compiled_graphs=[], neffs=[],
                  host_syncs=0,
                  executed_ops=executed,
                  fallback_ops={n: c for n, c in executed.items() if op_tracking.is_fallback(n)},
                  memory=_memory_rows(), memory_timeline=[], memory_timeline_device=timeline_device,
                  assumptions=cost_model.assumptions(profile) + time_model.assumptions()[:1]
                  + neff_forecast.assumptions())


def _costed(profile: cost_model.TrainiumProfile, results: dict, graphs: dict) -> tuple[dict, dict, dict]:
    """(each signature by key, its (family, cost), each compiled graph's (family, cost) per op)."""
    signatures = {key: observer.Signature.of_key(key) for key in results}
    costs: dict[tuple, tuple[str, cost_model.OpCost]] = {}
    for key, result_metas in results.items():
        signature, result = signatures[key], tuple(TensorMeta(*m) for m in result_metas)
        costs[key] = (_call_family(signature, result),
                      time_model.op_cost(profile, signature.op, signature.inputs, result))
    # A compiled graph's call is one fused NEFF: its ops' FLOPs, and only its inputs and outputs in HBM.
    graph_costs = {name: [(op_classes.family(op) if op else "data movement", time_model.cost(profile, *work))
                          for (op, _, _), work in zip([*g.ops, (None, (), ())], g.fused)]
                   for name, g in graphs.items()}
    return signatures, costs, graph_costs


def _phase_row(phase, signatures: dict, costs: dict, graph_costs: dict, graphs: dict) -> tuple[PhaseRow | None, list]:
    """A phase's row of the estimate (None when it ran nothing costed) and its (family, calls, cost)."""
    name, seconds, calls_by_key, graph_calls = phase
    phase_costs = [(costs[key][0], calls, costs[key][1]) for key, calls in calls_by_key.items()]
    for graph, calls in graph_calls.items():
        phase_costs.extend((fam, calls, cost) for fam, cost in graph_costs.get(graph, []))
    if not phase_costs:
        return None, []
    rows = _family_rows(phase_costs)
    roofline_ms = sum(r.estimated_ms for r in rows)
    neffs = neff_forecast.forecast({(signatures[k].op, signatures[k].inputs): n for k, n in calls_by_key.items()},
                                   [(g, graph_kind(graphs[g]), n) for g, n in graph_calls.items() if g in graphs])
    steady_ms = roofline_ms + time_model.launches_seconds(*neff_forecast.launch_counts(neffs)) * 1e3
    return PhaseRow(name, seconds, sum(calls_by_key.values()), sum(graph_calls.values()), roofline_ms,
                    sum(n.launches for n in neffs), steady_ms, rows), phase_costs


def _add_estimate(report: Report, profile: cost_model.TrainiumProfile, phases: list, results: dict,
                  graphs: dict) -> None:
    """Cost every observed signature and compiled graph, then fill in the phases, op families,
    signatures and compiled graphs of ``report``."""
    signatures, costs, graph_costs = _costed(profile, results, graphs)
    totals: Counter = Counter()
    graph_calls_total: Counter = Counter()
    all_costs = []
    for phase in phases:
        totals.update(phase[2])
        graph_calls_total.update(phase[3])
        row, phase_costs = _phase_row(phase, signatures, costs, graph_costs, graphs)
        if row is not None:
            report.phases.append(row)
            all_costs.extend(phase_costs)
    report.families = _family_rows(all_costs)
    report.estimated_ms = sum(r.estimated_ms for r in report.families)
    report.signatures = sorted(
        (SignatureRow(signatures[k].op, [str(m) for m in signatures[k].inputs], costs[k][0], calls, costs[k][1].flops,
                      costs[k][1].bytes, costs[k][1].seconds * 1e6) for k, calls in totals.items()),
        key=lambda r: (-r.estimated_us * r.calls, r.op))
    neffs = neff_forecast.forecast({(signatures[k].op, signatures[k].inputs): n for k, n in totals.items()},
                                   [(name, graph_kind(g), graph_calls_total.get(name, 0))
                                    for name, g in graphs.items()])
    report.neffs = neffs
    report.steady_state_seconds = report.estimated_ms / 1e3 + time_model.launches_seconds(
        *neff_forecast.launch_counts(neffs))
    report.steady_state_interval_seconds = time_model.CALIBRATION.interval(report.steady_state_seconds)
    report.first_run_seconds = neff_forecast.first_run_seconds(report.steady_state_seconds, neffs)
    report.host_syncs = sum(calls for k, calls in totals.items() if costs[k][0] == HOST_TRANSFER)
    report.compiled_graphs = [
        CompiledGraphRow(name, len(g.ops), graph_calls_total.get(name, 0),
                         sum(c.seconds for _, c in graph_costs[name]) * 1e3, g.error, g.lowering, dict(g.parts),
                         g.lowering_s, dict(sorted(g.stablehlo_ops.items())))
        for name, g in graphs.items()]
