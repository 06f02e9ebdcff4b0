"""The report as readable text (what ``print(torch_neuronx.report())`` shows): the verdict, the
findings by source line, the estimate, what ran, memory and assumptions, in that order (the HTML
page keeps the same order)."""
from __future__ import annotations

import os

from torch_neuronx.diagnostics import findings, places
from torch_neuronx.diagnostics.rows import CompiledGraphRow, FindingRow
from torch_neuronx.python_ops.op_classes import NOT_ESTIMATED
from torch_neuronx.runtime import format_bytes
from torch_neuronx.runtime.units import format_seconds, seconds_estimate

TOP_SIGNATURES = 12


def count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{int(n)}"


def estimate(ms: float, estimated: bool = True) -> str:
    """An estimated time in milliseconds, in the unit that reads best ('-' when not estimated)."""
    return format_seconds(ms / 1e3) if estimated else "-"


def where(row: FindingRow) -> str:
    """A finding's place, file:line: relative to the working directory when the file is inside it, to
    site-packages for an installed library's file (diffusers/models/upsampling.py), else in full."""
    if row.file is None:
        return row.site
    return f"{places.relative_path(row.file, os.getcwd())}:{row.line}"


def ops_seen(row: FindingRow) -> str:
    """'_to_copy x1, mul x1, sum x1 (float64 tensors)', with where the calls ran when it is not plain code."""
    text = ", ".join(f"{places.short_op(op)} x{n}" for op, n in row.ops.items() if op != "-")
    details = "; ".join(row.details)
    if details:
        text = f"{text} ({details})" if text else details
    if row.context:
        text += f", in {' and '.join(row.context)}"
    return text


def heading(severity: str, rows: list[FindingRow]) -> str:
    n = len({r.site for r in rows})
    return f"{findings.SEVERITIES[severity][0].upper()}{findings.SEVERITIES[severity][1:]} " \
           f"({n} place{'s' if n != 1 else ''})"


def by_severity(rows: list[FindingRow]) -> list[tuple[str, list[FindingRow]]]:
    return [(severity, [r for r in rows if r.severity == severity]) for severity in findings.SEVERITIES
            if any(r.severity == severity for r in rows)]


def _findings(report) -> list[str]:
    if not report.findings:
        return ["Findings: none." if report.collected else "Findings: calls were not observed."]
    lines = ["Findings, worst first: one row per source line and kind, with the ops seen there and their calls."]
    width = max(len(where(r)) for r in report.findings)
    for severity, rows in by_severity(report.findings):
        lines += ["", heading(severity, rows)]
        for r in rows:
            notes = "".join(f" [{n}]" for n in r.sources)
            lines.append(f"  {where(r):<{width}}  [{r.kind}]  {r.code}".rstrip())
            lines.append(f"      Means: {r.meaning}.{notes}")
            lines.append(f"      Seen:  {ops_seen(r)}")
            lines.append(f"      Fix:   {r.fix}.")
    if report.sources:
        lines += ["", "Sources:"]
        lines += [f"  [{s.id}] {s.name}: {s.url}" for s in report.sources]
    return lines


def _families(rows, indent: str = "  ") -> list[str]:
    lines = [f"{indent}{'op family':<16} {'calls':>8} {'FLOPs':>9} {'bytes':>11} {'est. time':>10}  bound"]
    for r in rows:
        lines.append(f"{indent}{r.family:<16} {r.calls:>8} {count(r.flops):>9} {format_bytes(r.bytes):>11} "
                     f"{estimate(r.estimated_ms, r.bound != 'not estimated'):>10}  {r.bound}")
    return lines


def _estimate(report) -> list[str]:
    lines = [f"ESTIMATED time on {report.profile.chip} at LNC={report.profile.lnc} (a roofline model with "
             f"calibrated peaks, python -m torch_neuronx.simulate's; not a measurement): "
             f"{estimate(report.estimated_ms)}; a warm run with its launches "
             f"{seconds_estimate(report.steady_state_seconds, report.steady_state_interval_seconds)} (the interval: "
             "where AWS's published figures fell around the model, each held out)"]
    lines.extend(_families(report.families))
    lines.append("")
    lines.append(f"  {'phase':<32} {'wall time here':>14} {'eager calls':>11} {'graph calls':>11} {'roofline':>10} "
                 f"{'launches':>9}  with launches")
    for p in report.phases:
        lines.append(f"  {p.name[:32]:<32} {format_seconds(p.wall_s):>14} {p.eager_calls:>11} "
                     f"{p.compiled_graph_calls:>11} {estimate(p.estimated_ms):>10} {p.launches:>9}  "
                     f"{format_seconds(p.steady_state_ms / 1e3)}")
    lines.append("")
    shown = report.signatures[:TOP_SIGNATURES]
    lines.append(f"  Top signatures by estimated time ({len(shown)} of {len(report.signatures)}):")
    for s in shown:
        each = "not estimated" if s.family in NOT_ESTIMATED else f"{estimate(s.estimated_us / 1e3)} each"
        lines.append(f"    {s.op}({', '.join(s.inputs)}) x{s.calls}: {each} [{s.family}]")
    return lines


def _what_ran(report) -> list[str]:
    ops = sum(report.executed_ops.values())
    lines = [f"What ran on neuron: {ops} calls of {len(report.executed_ops)} ops; on Trainium, "
             f"{len(report.fallback_ops)} of them would run on the CPU"
             + (f" ({', '.join(report.fallback_ops)})" if report.fallback_ops else "")]
    if report.collected:
        eager = sum(1 for n in report.neffs if n.kind == "eager")
        lines.append(f"  NEFFs a first run compiles: {len(report.neffs)}: {eager} for eager ops (TorchNeuron's kernel "
                     f"key: op, shapes, dtypes; aten::mm by row tile), {len(report.neffs) - eager} for compiled graphs "
                     "(the list: report.json and report.html)")
        lines.append(f"  Compiled graphs: {len(report.compiled_graphs)}; host<->device transfers and .item(): "
                     f"{report.host_syncs}")
        lines.extend(_lowering_lines(report.compiled_graphs))
    return lines


def _lowering_lines(graphs: list[CompiledGraphRow]) -> list[str]:
    """Each compiled graph lowered to StableHLO as TorchNeuron lowers it: its ops by kind, and the time."""
    if not graphs:
        return []
    total = sum(g.lowering_s for g in graphs)
    lines = [f"  StableHLO lowering (TorchNeuron's front end, torch-mlir): {format_seconds(total)} for "
             f"{len(graphs)} graph(s)"]
    for g in graphs:
        kinds = g.stablehlo_ops
        ops = ", ".join(f"{name.removeprefix('stablehlo.')} {n}" for name, n in
                        sorted(kinds.items(), key=lambda item: -item[1])[:8])
        status = ", ".join(f"{kind} {status}" for kind, status in g.parts.items())
        lowering = g.lowering
        if not status or lowering.startswith("not checked"):
            status = f"{status}; {lowering}" if status else lowering
        lines.append(f"    {g.name}: {status}"
                     + (f", {sum(kinds.values())} ops ({ops}{', ...' if len(kinds) > 8 else ''})" if kinds else ""))
    return lines


def _memory(report) -> list[str]:
    lines = ["Memory (peak since start / emulated capacity):"]
    for m in report.memory:
        lines.append(f"  {m.device}: {format_bytes(m.peak_bytes)} / {format_bytes(m.emulated_capacity_bytes)}")
    if not report.memory:
        lines.append("  neuron was not used")
    return lines


def render(report) -> str:
    sections = [[f"Trainium readiness report (torch-neuronx-cpu: every op ran on this host's CPU; {report.process})",
                 report.verdict.text],
                _findings(report)]
    if report.collected:
        sections.append(_estimate(report))
    sections += [_what_ran(report), _memory(report),
                 [f"Assumptions (profile: {report.profile.name}):", *(f"  - {a}" for a in report.assumptions)]]
    return "\n\n".join("\n".join(lines) for lines in sections)
