"""The report as one self-contained HTML page, in the text report's order: the verdict, the findings
by source line, the estimate (a stacked bar of time by phase and op family), what ran, memory (a
timeline from the first allocation) and assumptions. Inline SVG, no scripts, no network; it prints."""
from __future__ import annotations

from html import escape

from torch_neuronx.diagnostics import text
from torch_neuronx.python_ops.op_classes import NOT_ESTIMATED
from torch_neuronx.diagnostics.text import count, estimate
from torch_neuronx.runtime import format_bytes
from torch_neuronx.runtime.units import format_seconds, seconds_range

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1150px;padding:0 1.5em;
 color:#1d1d1f;line-height:1.4}
h1{font-size:1.6em;margin-bottom:0.1em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:0.2em}
h3{margin:1.2em 0 0.4em}.sub,.note{color:#555;font-size:0.9em}
table{border-collapse:collapse;margin:0.5em 0 1.2em;font-size:0.92em}
td,th{border:1px solid #d4d4d4;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,pre{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:0.92em}
#verdict{border:2px solid #888;border-left-width:10px;border-radius:6px;padding:0.8em 1.1em;margin:1.2em 0}
#verdict .status{font-size:1.3em;font-weight:700;margin:0;text-transform:uppercase;letter-spacing:0.03em}
#verdict .line{font-size:1.05em;margin:0.4em 0 0.6em}
#verdict ul{list-style:none;padding:0;margin:0;display:flex;flex-wrap:wrap;gap:0.6em 1.6em}
#verdict li b{font-size:1.35em;margin-right:0.25em}
.st-not-ready{border-color:#b42318!important;background:#fef3f2}.st-ready-with-changes{border-color:#b54708!important;
 background:#fffaeb}.st-ready{border-color:#067647!important;background:#ecfdf3}.st-not-checked{background:#f5f5f5}
table.findings{width:100%;table-layout:fixed}table.findings th:nth-child(1){width:25%}
table.findings th:nth-child(2){width:10%}table.findings th:nth-child(3){width:24%}table.findings th:nth-child(4){width:16%}
table.findings .loc{font-weight:600;white-space:nowrap}table.findings .dir{display:block;color:#666;font-size:0.85em;
 word-break:break-all}table.findings td{word-wrap:break-word}
table.findings pre{margin:0.3em 0 0;padding:3px 6px;background:#f6f8fa;border:1px solid #e5e7eb;border-radius:3px;
 white-space:pre-wrap;word-break:break-word}
.kind{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:0.85em}
h3.sev-would-fail{color:#b42318}h3.sev-computes-differently{color:#b54708}h3.sev-runs-slowly{color:#175cd3}
h3.sev-near-limit{color:#6941c6}
td.fix{background:#f6fef9}
ol.sources{font-size:0.88em;color:#333}ol.sources a{word-break:break-all}
@media print{body{max-width:none;margin:0;padding:0}h2{break-after:avoid}tr,#verdict,svg{break-inside:avoid}
 *{print-color-adjust:exact;-webkit-print-color-adjust:exact}}
"""

# Op families' colours, distinct in hue and lightness so the bar still reads in greyscale.
FAMILY_COLOURS = {"matmul": "#1f4e9c", "convolution": "#6a3d9a", "attention": "#b15928", "elementwise": "#5aae61",
                  "normalization": "#a6cee3", "softmax": "#e7298a", "reduction": "#fdbf6f", "data movement": "#8c8c8c",
                  "random": "#cab2d6", "other": "#d9d9d9"}


def _table(headers: list[str], rows: list[list[object]], numeric: set[int] = frozenset(), cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(
        f"<td class=\"num\">{escape(str(c))}</td>" if i in numeric or isinstance(c, (int, float)) and not
        isinstance(c, bool) else f"<td>{escape(str(c))}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    attribute = f' class="{cls}"' if cls else ""
    return f"<table{attribute}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict(report) -> str:
    v = report.verdict
    labels = {"would-fail": ("would fail", "would fail"),  # (one place, several)
              "computes-differently": ("computes differently", "compute differently"),
              "runs-slowly": ("runs slowly", "run slowly"), "near-limit": ("is near a limit", "are near a limit")}
    counts = "".join(f"<li><b>{n}</b>{'place' if n == 1 else 'places'} {escape(labels[severity][n != 1])}</li>"
                     for severity, n in v.places.items() if severity != "near-limit" or n)
    if report.collected:
        counts += (f"<li><b>{len(report.neffs)}</b>NEFFs to compile</li>"
                   f"<li><b>{escape(seconds_range(report.first_run_seconds))}</b>first run on "
                   f"{escape(report.profile.chip)}</li>"
                   f"<li><b>{escape(format_seconds(report.steady_state_seconds))}</b>each run after ("
                   f"{escape(seconds_range(report.steady_state_interval_seconds))}: the model's held-out error)</li>")
    status = v.status.replace(" ", "-")
    return (f"<section id=\"verdict\" class=\"st-{status}\"><p class=\"status\">{escape(v.status)}</p>"
            f"<p class=\"line\">{escape(v.text)}</p><ul>{counts}</ul></section>")


def _findings(report) -> str:
    if not report.findings:
        return ("<section id=\"findings\"><h2>Findings</h2><p>"
                + ("None: nothing here would fail, compute differently or run slowly on Trainium."
                   if report.collected else "Calls were not observed.") + "</p></section>")
    parts = ["<section id=\"findings\"><h2>Findings by source line</h2>",
             "<p class=\"note\">Worst first. One row per source line and kind; the ops seen there are merged with "
             "their number of calls.</p>"]
    for severity, rows in text.by_severity(report.findings):
        parts.append(f"<h3 class=\"sev-{severity}\">{escape(text.heading(severity, rows))}</h3>")
        parts.append("<table class=\"findings\"><thead><tr><th>where</th><th>kind</th><th>what it means on Trainium"
                     "</th><th>seen here</th><th>fix</th></tr></thead><tbody>")
        for r in rows:
            code = f"<pre>{escape(r.code)}</pre>" if r.code else ""
            notes = "".join(f" <a href=\"#source-{n}\">[{n}]</a>" for n in r.sources)
            folder, _, name = text.where(r).rpartition("/")
            folder = f"<span class=\"dir\">{escape(folder)}/</span>" if folder else ""
            parts.append(f"<tr><td class=\"where\">{folder}<span class=\"loc\">{escape(name)}</span>{code}</td>"
                         f"<td class=\"kind\">{escape(r.kind)}</td><td>{escape(r.meaning)}.{notes}</td>"
                         f"<td>{escape(text.ops_seen(r))}</td><td class=\"fix\">{escape(r.fix)}.</td></tr>")
        parts.append("</tbody></table>")
    if report.sources:
        parts.append("<h3>Sources</h3><ol class=\"sources\">" + "".join(
            f"<li id=\"source-{s.id}\" value=\"{s.id}\">{escape(s.name)}. "
            f"<a href=\"{escape(s.url)}\">{escape(s.url)}</a></li>" for s in report.sources) + "</ol>")
    parts.append("</section>")
    return "".join(parts)


def phase_family_chart(phases, families) -> str:
    """Estimated time of each phase as a bar stacked by op family, with a legend of the families' totals."""
    order = [f.family for f in families if f.bound != "not estimated" and f.estimated_ms > 0]
    bars = [(p.name, {f.family: f.estimated_ms for f in p.families if f.family in order}) for p in phases]
    bars = [(name, parts) for name, parts in bars if sum(parts.values()) > 0]
    if not bars:
        return "<p class=\"note\">Nothing to estimate.</p>"
    total = sum(f.estimated_ms for f in families if f.family in order)
    top = max(sum(parts.values()) for _, parts in bars)
    width, label_w, bar_w, bar_h, gap = 900, 190, 600, 24, 10
    legend_y = len(bars) * (bar_h + gap) + 14
    legend_rows = (len(order) + 2) // 3
    height = legend_y + legend_rows * 22 + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="13" '
           f'role="img" aria-label="estimated time by phase and op family">']
    for i, (name, parts) in enumerate(bars):
        y, x = i * (bar_h + gap), float(label_w)
        out.append(f'<text x="{label_w - 8}" y="{y + 17}" text-anchor="end">{escape(name[:28])}</text>')
        for family in order:
            ms = parts.get(family, 0.0)
            if ms <= 0:
                continue
            w = bar_w * ms / top
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar_h}" '
                       f'fill="{FAMILY_COLOURS.get(family, "#d9d9d9")}" stroke="#fff" stroke-width="0.5">'
                       f'<title>{escape(name)}, {escape(family)}: {escape(estimate(ms))}</title></rect>')
            x += w
        out.append(f'<text x="{x + 8:.1f}" y="{y + 17}">{escape(estimate(sum(parts.values())))}</text>')
    for j, family in enumerate(order):
        ms = sum(parts.get(family, 0.0) for _, parts in bars)
        lx, ly = 10 + (j % 3) * 295, legend_y + (j // 3) * 22
        out.append(f'<rect x="{lx}" y="{ly}" width="14" height="14" fill="{FAMILY_COLOURS.get(family, "#d9d9d9")}" '
                   f'stroke="#555" stroke-width="0.5"/><text x="{lx + 20}" y="{ly + 12}">{escape(family)}: '
                   f'{escape(estimate(ms))} ({escape(_share(ms, total))})</text>')
    out.append("</svg>")
    return "".join(out)


def _share(part: float, whole: float) -> str:
    share = 100 * part / whole
    return "<1%" if share < 1 else f"{share:.0f}%"


def _estimate(report) -> str:
    families = [[r.family, r.calls, count(r.flops), format_bytes(r.bytes),
                 estimate(r.estimated_ms, r.bound != "not estimated"), r.bound] for r in report.families]
    phases = [[p.name, format_seconds(p.wall_s), p.eager_calls, p.compiled_graph_calls, estimate(p.estimated_ms),
               p.launches, format_seconds(p.steady_state_ms / 1e3)] for p in report.phases]
    shown = report.signatures[:text.TOP_SIGNATURES * 4]
    return "".join([
        f"<section id=\"estimate\"><h2>ESTIMATED time on {escape(report.profile.chip)} at LNC="
        f"{report.profile.lnc}: {escape(estimate(report.estimated_ms))}</h2>",
        "<p class=\"note\">Times here are <strong>estimates</strong> from a roofline model of one logical NeuronCore "
        "with calibrated peaks (see the assumptions), not measurements: every op ran on this host's CPU.</p>",
        "<h3>By phase and op family</h3>", phase_family_chart(report.phases, report.families),
        _table(["op family", "calls", "FLOPs", "bytes", "est. time", "bound"], families, numeric={1, 2, 3, 4}),
        _table(["phase", "wall time here", "eager calls", "graph calls", "roofline", "launches", "with launches"],
               phases, numeric={1, 2, 3, 4, 5, 6}),
        f"<h3>Top signatures by estimated time ({len(shown)} of {len(report.signatures)})</h3>",
        _table(["op", "inputs", "family", "calls", "est. time each"],
               [[s.op, ", ".join(s.inputs), s.family, s.calls, estimate(s.estimated_us / 1e3, s.family not in
                                                                          NOT_ESTIMATED)] for s in shown],
               numeric={3, 4}),
        "</section>"])


def _what_ran(report) -> str:
    ops = sum(report.executed_ops.values())
    fallback = ", ".join(report.fallback_ops)
    parts = [f"<section id=\"ran\"><h2>What ran</h2><p>{ops} op calls of {len(report.executed_ops)} ops on neuron; "
             f"on Trainium, {len(report.fallback_ops)} of them would run on the CPU"
             f"{escape(f' ({fallback})') if fallback else ''}.</p>"]
    if report.collected:
        eager = [n for n in report.neffs if n.kind == "eager"]
        parts.append(f"<p>{len(report.neffs)} NEFFs for a first run to compile: {len(eager)} for eager ops (TorchNeuron's "
                     f"kernel key: op, shapes, dtypes; aten::mm by row tile) and {len(report.neffs) - len(eager)} for "
                     f"compiled graphs; {report.host_syncs} host&lt;-&gt;device transfers and .item() calls.</p>")
        parts.append("<h3>The NEFF forecast</h3>" + _table(
            ["NEFF", "kind", "inputs", "calls", "launches"],
            [[n.name, n.kind, ", ".join(n.inputs), n.calls, n.launches] for n in report.neffs],
            numeric={3, 4}))
    if report.compiled_graphs:
        parts.append("<h3>Compiled graphs lowered to StableHLO</h3>" + _table(
            ["graph", "calls", "lowering", "StableHLO ops", "lowering time"],
            [[g.name, g.calls, ", ".join(f"{k} {v}" for k, v in g.parts.items()) or g.lowering,
              sum(g.stablehlo_ops.values()), format_seconds(g.lowering_s)] for g in report.compiled_graphs],
            numeric={1, 3, 4}))
    parts.append("</section>")
    return "".join(parts)


def memory_chart(timeline, peak: int, capacity: int) -> str:
    """Bytes allocated from the first allocation on, scaled to the allocator's peak (which the samples,
    taken every few calls, may miss), with the capacity when it is near."""
    if len(timeline) < 2:
        return "<p class=\"note\">Too few memory samples for a timeline.</p>"
    width, height, left, right, top_pad, bottom = 900, 230, 90, 20, 14, 40
    t_end = timeline[-1][0] or 1e-9
    top = max(peak, max(b for _, b in timeline), 1)
    show_capacity = bool(capacity) and capacity < 4 * top
    scale_top = max(top, capacity) if show_capacity else top
    x = lambda t: left + (width - left - right) * t / t_end  # noqa: E731
    y = lambda b: height - bottom - (height - bottom - top_pad) * b / scale_top  # noqa: E731
    steps = [timeline[0]]
    for (_, before), (t, after) in zip(timeline, timeline[1:]):  # allocated holds until the next sample
        steps += [(t, before), (t, after)]
    points = " ".join(f"{x(t):.1f},{y(b):.1f}" for t, b in steps)
    base = height - bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="12" role="img" '
             f'aria-label="memory allocated since the first allocation">',
             f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top_pad}" x2="{left}" y2="{base}" stroke="#888"/>',
             f'<polyline fill="none" stroke="#1f4e9c" stroke-width="1.6" points="{points}"/>',
             f'<line x1="{left}" y1="{y(peak):.1f}" x2="{width - right}" y2="{y(peak):.1f}" stroke="#1f4e9c" '
             f'stroke-dasharray="2 3"/>',
             f'<text x="{left - 6}" y="{y(peak) + 4:.1f}" text-anchor="end">peak {escape(format_bytes(peak))}</text>',
             f'<text x="{left - 6}" y="{base + 4}" text-anchor="end">0 B</text>',
             f'<text x="{left}" y="{base + 18}" text-anchor="middle">0 s</text>',
             f'<text x="{width - right}" y="{base + 18}" text-anchor="end">{escape(format_seconds(t_end))}</text>',
             f'<text x="{(left + width - right) / 2}" y="{base + 34}" text-anchor="middle" fill="#555">time since the '
             f'first neuron allocation (wall time on this host)</text>']
    if show_capacity:
        parts.append(f'<line x1="{left}" y1="{y(capacity):.1f}" x2="{width - right}" y2="{y(capacity):.1f}" '
                     f'stroke="#b42318" stroke-dasharray="5 3"/><text x="{width - right - 4}" y="{y(capacity) - 4:.1f}" '
                     f'text-anchor="end" fill="#b42318">capacity {escape(format_bytes(capacity))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _memory(report) -> str:
    row = next((m for m in report.memory if m.device == report.memory_timeline_device), None)
    chart = ""
    if row is not None:
        chart = (f"<h3>{escape(row.device)}: allocated over time</h3>"
                 + memory_chart(report.memory_timeline, row.peak_bytes, row.emulated_capacity_bytes))
    return ("<section id=\"memory\"><h2>Memory</h2>"
            + _table(["device", "peak", "emulated capacity"],
                     [[m.device, format_bytes(m.peak_bytes), format_bytes(m.emulated_capacity_bytes)]
                      for m in report.memory], numeric={1, 2})
            + (chart or "<p class=\"note\">neuron was not used.</p>") + "</section>")


def render(report) -> str:
    sections = [
        "<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        "<title>Trainium readiness report</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>Trainium readiness report</h1>",
        f"<p class=\"sub\">torch-neuronx-cpu: every op ran on this host's CPU ({escape(report.process)}). Profile: "
        f"{escape(report.profile.name)}.</p>",
        _verdict(report), _findings(report),
        _estimate(report) if report.collected else "",
        _what_ran(report), _memory(report),
        "<section id=\"assumptions\"><h2>Assumptions</h2><ul>"
        + "".join(f"<li>{escape(a)}</li>" for a in report.assumptions) + "</ul></section>",
        "</body></html>",
    ]
    return "\n".join(s for s in sections if s)
