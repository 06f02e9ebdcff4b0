"""The report as a readable text table (what ``print(torch_neuronx.report())`` shows)."""
from __future__ import annotations

from torch_neuronx.diagnostics import findings
from torch_neuronx.runtime import format_bytes

TOP_SIGNATURES = 12


def count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{int(n)}"


def _families(rows, indent: str = "  ") -> list[str]:
    lines = [f"{indent}{'op family':<16} {'calls':>8} {'FLOPs':>9} {'bytes':>11} {'est. ms':>10}  bound"]
    for r in rows:
        est = "-" if r.bound == "not estimated" else f"{r.estimated_ms:.4f}"
        lines.append(f"{indent}{r.family:<16} {r.calls:>8} {count(r.flops):>9} {format_bytes(r.bytes):>11} {est:>10}  "
                     f"{r.bound}")
    return lines


def render(report) -> str:
    lines = [f"Trainium readiness report (torch-neuronx-cpu: every op ran on the host; {report.process})", ""]
    lines.append(f"Profile: {report.profile['name']}")
    ops = sum(report.executed_ops.values())
    lines.append(f"Ops executed on neuron: {ops} calls of {len(report.executed_ops)} ops; "
                 f"on Trainium, {len(report.fallback_ops)} of them would run on the CPU"
                 + (f" ({', '.join(report.fallback_ops)})" if report.fallback_ops else ""))
    if report.collected:
        lines.append(f"Eager op signatures (op, shapes, dtypes): {report.neff_signatures} -> as many NEFF compiles "
                     "in TorchNeuron's eager mode (its first-run warm-up)")
        lines.append(f"Compiled graphs: {len(report.compiled_graphs)} (one NEFF each); host<->device transfers and .item(): "
                     f"{report.host_syncs}")
        lines.extend(_lowering_lines(report.compiled_graphs))
    lines.append("")

    lines.append(f"Findings ({len(report.findings)}):")
    if not report.findings:
        lines.append("  none" if report.collected else "  (calls were not observed)")
    for f in report.findings:
        lines.append(f"  [{f['kind']}] {f['op']} x{f['count']} at {f['site']}")
        lines.append(f"      {f['detail']}. {findings.KINDS.get(f['kind'], '')}.")
    lines.append("")

    if report.collected:
        lines.append(f"ESTIMATED time on {report.profile['chip']} (a roofline model, not a measurement): "
                     f"{report.estimated_ms:.3f} ms")
        lines.extend(_families(report.families))
        lines.append("")
        lines.append(f"  {'phase':<32} {'wall s here':>11} {'eager calls':>11} {'graph calls':>11} {'est. ms':>10}")
        for p in report.phases:
            lines.append(f"  {p.name[:32]:<32} {p.wall_s:>11.3f} {p.eager_calls:>11} {p.compiled_graph_calls:>11} "
                         f"{p.estimated_ms:>10.4f}")
        lines.append("")
        lines.append(f"  Top signatures by estimated time (of {len(report.signatures)}):")
        for s in report.signatures[:TOP_SIGNATURES]:
            lines.append(f"    {s.op}({', '.join(s.inputs)}) x{s.calls}: {s.estimated_us:.3f} us each "
                         f"[{s.family}]")
        lines.append("")

    lines.append("Memory (peak since start / emulated capacity):")
    for m in report.memory:
        lines.append(f"  {m.device}: {format_bytes(m.peak_bytes)} / {format_bytes(m.emulated_capacity_bytes)}")
    if not report.memory:
        lines.append("  neuron was not used")
    lines.append("")
    lines.append("Assumptions:")
    lines.extend(f"  - {a}" for a in report.assumptions)
    return "\n".join(lines)


def _lowering_lines(graphs: list[dict]) -> list[str]:
    """Each compiled graph lowered to StableHLO as TorchNeuron lowers it: its ops by kind, and the time."""
    if not graphs:
        return []
    total = sum(g.get("lowering_s", 0.0) for g in graphs)
    lines = [f"StableHLO lowering (TorchNeuron's front end, torch-mlir): {total:.2f} s for {len(graphs)} graph(s)"]
    for g in graphs:
        kinds = g.get("stablehlo_ops") or {}
        ops = ", ".join(f"{name.removeprefix('stablehlo.')} {n}" for name, n in
                        sorted(kinds.items(), key=lambda item: -item[1])[:8])
        lines.append(f"  {g['name']}: {g.get('lowering', 'not lowered')}"
                     + (f", {sum(kinds.values())} ops ({ops}{', ...' if len(kinds) > 8 else ''})" if kinds else ""))
    return lines
