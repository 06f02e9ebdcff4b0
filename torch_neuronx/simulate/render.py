"""The plan as text and as a self-contained HTML page, and its three files (plan.json, plan.txt,
plan.html). Time comes first: what a step and a token cost on the instance, and what it rests on."""
from __future__ import annotations

import dataclasses
import html
import os
from collections import Counter
from typing import ClassVar

from torch_neuronx.runtime.rows import Row, jsonable
from torch_neuronx.simulate.rows import RankRow, StepRow
from torch_neuronx.runtime.units import format_bytes, format_seconds, id_ranges, seconds_estimate, seconds_range

# Which choices of the program move its time, named where the plan sees them.
CHOICES = [
    "eager vs compiled: each eager op is a NEFF launch of its own; a compiled graph is one launch, its ops "
    "fused (only its inputs and outputs cross HBM)",
    "activation checkpointing: the forward runs again in the backward (more compute, less memory)",
    "sequence parallelism: each all_reduce becomes a reduce_scatter and an all_gather (the same bytes on the "
    "links), and the norms and dropout between them run on 1/TP of the sequence",
]


def _ranks_shown(text: str) -> str:
    """A group's ranks for reading: an evenly strided list shortened ('0,32,64,...,992', 32 ranks)."""
    parts = text.split(",")
    if len(parts) > 4 and all(p.isdigit() for p in parts):
        steps = {int(b) - int(a) for a, b in zip(parts, parts[1:])}
        if len(steps) == 1:
            return f"{','.join(parts[:3])},...,{parts[-1]} ({len(parts)} ranks)"
    return text


def _rate(row: StepRow) -> str:
    for unit, seconds, interval, rate in (
            ("token", row.per_token_seconds, row.per_token_interval_seconds, row.tokens_per_second),
            ("sequence", row.per_sequence_seconds, row.per_sequence_interval_seconds, row.sequences_per_second)):
        if seconds is not None:
            return f"; {seconds_estimate(seconds, interval)} per {unit} ({rate:.3g} {unit}s/s)"
    return ""


def _collectives(row: StepRow | RankRow) -> str:
    """A step's or rank's collectives, by the mechanisms the model names."""
    calls, comm = row.collective_calls, row.communication_seconds
    if not calls:
        return "no collectives"
    ring = row.communication_latency_seconds - row.communication_fixed_seconds
    transfer = comm - row.communication_latency_seconds
    hidden = row.communication_hidden_seconds
    return (f"collectives {format_seconds(comm)} ({calls:g} calls: {format_seconds(row.communication_fixed_seconds)} "
            f"fixed cost, {format_seconds(ring)} ring steps, {format_seconds(transfer)} bytes on the links"
            + (f"; {format_seconds(hidden)} of it hidden under the backward" if hidden else "") + ")")


def _work(row: StepRow | RankRow) -> str:
    return (f"compute {format_seconds(row.compute_seconds)}, launches {format_seconds(row.launch_seconds)} "
            f"({row.eager_launches:g} eager, {row.graph_launches:g} graph), {_collectives(row)}")


INTERVAL = "where AWS's published rows fell around the model, each held out"


def time_lines(plan) -> list[str]:
    t = plan.time
    if t is None:
        return []
    slow = next((r for r in plan.ranks if r.rank == t.slowest_rank), plan.ranks[0])
    out = [f"time on {plan.nnodes} x {plan.instance} (LNC={plan.lnc}), an estimate: "
           f"{seconds_estimate(t.step_seconds, t.interval_seconds)} per run of the program (the interval: "
           f"{INTERVAL}); slowest rank {t.slowest_rank}: {_work(slow)}"]
    for name, row in t.steps.items():
        out.append(f"  step {name!r} x {row.count}: {seconds_estimate(row.seconds, row.interval_seconds)} "
                   f"per step{_rate(row)}; {_work(row)}")
        if row.eager_launches >= 100:
            out.append(f"    {row.eager_launches:g} eager op launches per step: compiling the step "
                       "(torch.compile(backend='neuron')) makes each graph one launch")
    if not t.steps:
        out.append("  (the program marks no steps: with torch_neuronx.simulate.step('train', sequences=N) around "
                   "each step, the plan gives time per step and per sequence or token)")
    return out


def bounds_lines(plan) -> list[str]:
    """The details: each estimate's bounds, every collective hidden under the compute or none."""
    t = plan.time
    if t is None:
        return []
    out = [f"bounds of the run: {seconds_range(t.bounds_seconds)} (every collective hidden under the compute, "
           "none hidden)"]
    out += [f"  step {name!r}: {seconds_range(row.bounds_seconds)}" for name, row in t.steps.items()]
    return out


def _rank_rows(plan) -> list[tuple[list[int], RankRow]]:
    """Ranks whose rows would read the same, grouped: (ranks, the first one's entry)."""
    rows: dict[tuple, tuple[list[int], RankRow]] = {}
    for r in plan.ranks:
        key = (r.node if len(plan.ranks) <= 64 else None, r.chip if len(plan.ranks) <= 64 else None,
               r.peak_bytes, r.collective_calls, round(r.communication_seconds, 12), round(r.step_seconds, 12), r.fits)
        rows.setdefault(key, ([], r))[0].append(r.rank)
    return list(rows.values())


def _memory_lines(plan) -> list[str]:
    """HBM per rank, the divergence error if any, and each rank over its HBM with where it crossed."""
    cap = plan.capacity_bytes
    peaks = [r.peak_bytes for r in plan.ranks]
    out = [f"HBM per rank: {format_bytes(cap)}; peak {format_bytes(min(peaks))} to {format_bytes(max(peaks))}"]
    if plan.divergence:
        out.append("ERROR " + plan.divergence.message)
    for o in plan.over_capacity:
        where = (f"crossed by a {format_bytes(o.allocation_bytes)} allocation ({o.op}) at "
                 f"{o.line or o.site or 'an unknown line'}" if o.allocation_bytes else
                 "where it crossed is not known (re-costed for a smaller HBM: run the simulation to find the line)")
        out.append(f"OVER HBM: rank {o.rank} peaks at {format_bytes(o.peak_bytes)} > {format_bytes(cap)}; {where}")
    return out


def _run_lines(plan) -> list[str]:
    """How the plan was made (re-costed, which ranks ran) and its process groups."""
    out = []
    sim = plan.simulation
    sym = sim.symmetry
    if sim.recosted_from:
        out.append(f"re-costed from {sim.recosted_from} (recorded on {sim.recorded_on}); nothing was run again")
    if sym.used:
        out.append(f"ran {sim.script_runs} of {plan.world_size} ranks (0 and the last): the program never used "
                   f"its rank and the last rank's record is rank 0's with its groups translated; the others are "
                   f"rank 0's relabelled (--all-ranks runs each)")
    elif sym.why_every_rank_ran:
        out.append(f"ran every rank: {sym.why_every_rank_ran}")
    out.append("groups: " + "; ".join(f"{g.name} = ranks {_ranks_shown(g.ranks)} over {g.link}" for g in plan.groups[:12])
               + (f"; ... {len(plan.groups) - 12} more" if len(plan.groups) > 12 else ""))
    return out


def _rank_table(plan) -> list[str]:
    """The table of ranks (alike ones on one row), then rank 0's collectives, the largest first."""
    cap = plan.capacity_bytes
    out = ["", f"{'ranks':>11} {'node':>4} {'chip':>4} {'peak':>11} {'of HBM':>7} {'collectives':>11} {'comm':>10} "
               f"{'time per run':>12}"]
    for members, r in _rank_rows(plan):
        spread = len(members) > 1 and len(plan.ranks) > 64  # a row of ranks on several nodes and chips
        out.append(f"{id_ranges(members):>11} {'-' if spread else r.node:>4} {'-' if spread else r.chip:>4} "
                   f"{format_bytes(r.peak_bytes):>11} "
                   f"{100 * r.peak_bytes / cap:>6.1f}% {r.collective_calls:>11} "
                   f"{format_seconds(r.communication_seconds):>10} {format_seconds(r.step_seconds):>12}"
                   + ("" if r.fits else "  OVER"))
    first = plan.ranks[0] if plan.ranks else None
    if first:
        counted = Counter()
        for c in first.collectives:
            counted[(c.op, c.group, c.bytes, c.line)] += c.calls
        out += ["", f"rank 0's collectives ({first.collective_calls}), grouped:"]
        for (op, group, nbytes, line), n in sorted(counted.items(), key=lambda kv: -kv[1] * kv[0][2])[:20]:
            out.append(f"  {n:>4} x {op} of {format_bytes(nbytes)} on {group} at {line}")
        out += _overlap_lines(plan)
    return out


def _overlap_lines(plan) -> list[str]:
    """Rank 0's backwards whose collectives run under their compute (DDP's buckets), each bucket in
    launch order with its bytes and line, and the time hidden."""
    backwards = plan.time.backward_overlap if plan.time is not None else []
    if not backwards:
        return []
    out = ["", "rank 0's collectives launched by the backward and run under it (DDP's gradient buckets), in "
               "launch order:"]
    for i, b in enumerate(backwards[:8]):
        calls = b.calls
        sizes = ", ".join(format_bytes(c.bytes) for c in calls[:12]) + (", ..." if len(calls) > 12 else "")
        out.append(f"  backward {i + 1}{'' if b.step is None else ' of step ' + repr(b.step)} at "
                   f"{calls[0].line}: {len(calls)} x {calls[0].op} ({sizes}); "
                   f"{format_seconds(b.hidden_seconds)} hidden under the backward, "
                   f"{format_seconds(b.exposed_seconds)} after it")
    if len(backwards) > 8:
        out.append(f"  ... {len(backwards) - 8} more backwards (plan.json: time.backward_overlap)")
    return out


class PlanFiles(Row):
    """What a structure plan and a numerics plan (dataclasses whose last two fields are ``schema`` and
    ``mode``) share as a result (``runtime.outputs.Result``): their files plan.json (:meth:`to_dict`),
    plan.txt and plan.html; ``from_dict`` reads a plan.json back."""
    stem: ClassVar[str] = "plan"

    def to_dict(self) -> dict:
        """plan.json: the fields, schema and mode first, each row as its dict."""
        fields = [f.name for f in dataclasses.fields(self)]
        return {name: jsonable(getattr(self, name)) for name in ["schema", "mode", *fields[:-2]]}

    def text(self) -> str:
        return text(self)

    def html(self) -> str:
        return page(self)


def text(plan) -> str:
    out = [f"neuron plan: {os.path.basename(plan.script)} as {plan.world_size} ranks on "
           f"{plan.nnodes} x {plan.instance} (LNC={plan.lnc}, {plan.nproc_per_node} ranks per node)"]
    if plan.mode == "numerics":
        out.append(numerics_text(plan))
        return "\n".join(out) + "\n"
    out += time_lines(plan) + _memory_lines(plan) + _run_lines(plan) + _rank_table(plan)
    t = plan.time
    out += ["", *bounds_lines(plan), "how the time is estimated: " + " ".join(t.assumptions if t else []),
            "what moves it: " + "; ".join(CHOICES),
            "sources: " + "; ".join(t.sources if t else plan.communication.sources),
            "not modelled: " + "; ".join(plan.communication.assumptions),
            "cannot see: real link timing and contention, EFA and placement-group setup, the compiler's scheduling "
            "inside a NEFF, the compiler's NEFFs and their memory, the runtime's own buffers beyond its fixed "
            "reservation"]
    return "\n".join(out) + "\n"


def numerics_text(plan) -> str:
    num = plan.numerics
    lines = [f"numerics: {'PASS' if num.ok else 'FAIL'} against one device ({num.tolerance})"]
    for name, row in num.outputs.items():
        lines.append(f"  {name}: max |difference| over ranks {row.max_abs_difference:.3g} "
                     f"({'ok' if row.ok else 'differs'}; worst rank {row.worst_rank})")
    return "\n".join(lines)


def page(plan) -> str:
    """A self-contained HTML page of the plan (no scripts, no external files)."""
    e = html.escape
    body = [f"<h1>Neuron plan: {e(os.path.basename(plan.script))}</h1>"]
    if plan.mode != "numerics" and plan.time:
        body.append("<h2>Time</h2><ul>" + "".join(f"<li>{e(line.strip())}</li>" for line in time_lines(plan))
                    + "</ul><details><summary>Bounds: every collective hidden, none hidden</summary><ul>"
                    + "".join(f"<li>{e(line.strip())}</li>" for line in bounds_lines(plan)) + "</ul></details>")
    body.append(f"<pre>{e(text(plan))}</pre>")
    if plan.mode != "numerics":
        cap = plan.capacity_bytes
        rows = "".join(
            f"<tr class='{'over' if not r.fits else ''}'><td>{e(id_ranges(members))}</td><td>{r.node}</td>"
            f"<td>{r.chip}</td><td>{e(format_bytes(r.peak_bytes))}</td><td><div class='bar'><div style='width:"
            f"{min(100, 100 * r.peak_bytes / cap):.1f}%'></div></div></td><td>{r.collective_calls}</td>"
            f"<td>{e(format_seconds(r.communication_seconds))}</td>"
            f"<td>{e(seconds_estimate(r.step_seconds, r.step_interval_seconds))}</td></tr>"
            for members, r in _rank_rows(plan))
        body.append("<table><tr><th>ranks</th><th>node</th><th>chip</th><th>peak</th><th>of "
                    f"{e(format_bytes(cap))}</th><th>collectives</th><th>communication</th><th>time per run</th></tr>"
                    f"{rows}</table>")
    style = ("body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em;overflow:auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
             ".bar{width:160px;background:#eee}.bar div{background:#4a7;height:10px}tr.over .bar div{background:#c33}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>neuron plan</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")


