"""The report as one self-contained HTML page: a bar chart of estimated time per op family, the
memory timeline, findings and phases. Inline SVG, no scripts, no network."""
from __future__ import annotations

from html import escape

from torch_neuronx.diagnostics import findings
from torch_neuronx.diagnostics.text import count
from torch_neuronx.runtime import format_bytes

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.num{text-align:right}.note{color:#666;font-size:0.9em}h2{margin-top:1.5em}"""


def _table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(
        f"<td class=\"num\">{escape(str(c))}</td>" if isinstance(c, (int, float)) else f"<td>{escape(str(c))}</td>"
        for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def family_chart(families) -> str:
    rows = [f for f in families if f.bound != "not estimated"]
    if not rows:
        return "<p class=\"note\">No estimated op families.</p>"
    width, bar_h, label_w = 760, 22, 150
    top = max(r.estimated_ms for r in rows) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{bar_h * len(rows) + 10}" '
             f'role="img" aria-label="estimated ms per op family">']
    for i, r in enumerate(rows):
        y = i * bar_h + 5
        w = max(1.0, (width - label_w - 120) * r.estimated_ms / top)
        colour = "#d9822b" if r.bound == "compute" else "#3b7dd8"
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="13">{escape(r.family)}</text>'
                     f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{bar_h - 6}" fill="{colour}">'
                     f'<title>{escape(r.family)}: {r.estimated_ms:.4f} ms ({r.bound}-bound)</title></rect>'
                     f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" font-size="12">{r.estimated_ms:.4f} ms</text>')
    parts.append("</svg>")
    return "".join(parts)


def memory_chart(timeline, capacity: int) -> str:
    if len(timeline) < 2:
        return "<p class=\"note\">Too few memory samples for a timeline.</p>"
    width, height, pad = 760, 240, 50
    t_end = timeline[-1][0] or 1.0
    top = max(max(b for _, b in timeline), 1)
    scale_top = max(top, capacity) if capacity and capacity < 4 * top else top  # show the limit when it is near
    x = lambda t: pad + (width - pad - 10) * t / t_end  # noqa: E731
    y = lambda b: height - 25 - (height - 40) * b / scale_top  # noqa: E731
    points = " ".join(f"{x(t):.1f},{y(b):.1f}" for t, b in timeline)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="memory allocated over time">',
             f'<line x1="{pad}" y1="{height - 25}" x2="{width - 10}" y2="{height - 25}" stroke="#888"/>',
             f'<line x1="{pad}" y1="10" x2="{pad}" y2="{height - 25}" stroke="#888"/>',
             f'<polyline fill="none" stroke="#3b7dd8" stroke-width="1.5" points="{points}"/>',
             f'<text x="{pad - 4}" y="{y(top) + 4:.1f}" text-anchor="end" font-size="11">{escape(format_bytes(top))}</text>',
             f'<text x="{width - 10}" y="{height - 8}" text-anchor="end" font-size="11">{t_end:.2f} s</text>']
    if scale_top == capacity and capacity:
        parts.append(f'<line x1="{pad}" y1="{y(capacity):.1f}" x2="{width - 10}" y2="{y(capacity):.1f}" '
                     f'stroke="#c33" stroke-dasharray="4 3"/><text x="{width - 12}" y="{y(capacity) - 4:.1f}" '
                     f'text-anchor="end" font-size="11" fill="#c33">capacity {escape(format_bytes(capacity))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render(report) -> str:
    profile = report.profile
    capacity = report.memory[0].emulated_capacity_bytes if report.memory else 0
    finding_rows = [[f["kind"], f["op"], f["count"], f["site"], f"{f['detail']}. {findings.KINDS.get(f['kind'], '')}"]
                    for f in report.findings]
    sections = [
        "<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<title>Trainium readiness report</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>Trainium readiness report</h1>",
        f"<p>Profile: {escape(profile['name'])}. Every op ran on the host (torch-neuronx-cpu); times below are "
        f"<strong>estimates</strong> from a roofline model, not measurements.</p>",
        f"<p>{sum(report.executed_ops.values())} op calls of {len(report.executed_ops)} ops; "
        f"{report.neff_signatures} eager signatures (NEFF compiles in TorchNeuron's eager mode); "
        f"{len(report.compiled_graphs)} compiled graphs; {report.host_syncs} host transfers; "
        f"estimated total {report.estimated_ms:.3f} ms.</p>",
        "<h2>Estimated time per op family</h2>", family_chart(report.families),
        _table(["op family", "calls", "FLOPs", "bytes", "est. ms", "bound"],
               [[r.family, r.calls, count(r.flops), format_bytes(r.bytes), round(r.estimated_ms, 4), r.bound]
                for r in report.families]),
        "<h2>Memory timeline</h2>", memory_chart(report.memory_timeline, capacity),
        _table(["device", "peak", "emulated capacity"],
               [[m.device, format_bytes(m.peak_bytes), format_bytes(m.emulated_capacity_bytes)] for m in report.memory]),
        "<h2>Compiled graphs lowered to StableHLO</h2>",
        _table(["graph", "lowering", "StableHLO ops", "lowering s"],
               [[g["name"], g.get("lowering", ""), sum((g.get("stablehlo_ops") or {}).values()),
                 round(g.get("lowering_s", 0.0), 3)] for g in report.compiled_graphs]),
        f"<h2>Findings ({len(report.findings)})</h2>",
        _table(["kind", "op", "count", "where", "what it means"], finding_rows) if finding_rows
        else "<p>None.</p>",
        "<h2>Phases</h2>",
        _table(["phase", "wall s here", "eager calls", "graph calls", "est. ms"],
               [[p.name, round(p.wall_s, 3), p.eager_calls, p.compiled_graph_calls, round(p.estimated_ms, 4)]
                for p in report.phases]),
        "<h2>Top signatures</h2>",
        _table(["op", "inputs", "family", "calls", "est. us each"],
               [[s.op, ", ".join(s.inputs), s.family, s.calls, round(s.estimated_us, 3)]
                for s in report.signatures[:50]]),
        "<h2>Assumptions</h2><ul>" + "".join(f"<li>{escape(a)}</li>" for a in report.assumptions) + "</ul>",
        "</body></html>",
    ]
    return "\n".join(sections)
