"""The plan: each rank's peak memory against its core's HBM, its collectives, their estimated time
on the instance's links, and whether the ranks agree on their collectives.

The time estimate is a bandwidth model: each collective moves its ring algorithm's bytes (an
all_reduce 2(n-1)/n of its buffer, an all_gather or reduce_scatter (n-1)/n, a broadcast all of it)
over the slowest link its group crosses (between instances: EFA, or NeuronLink inside an
UltraServer; between chips: NeuronLink; inside a chip: unpublished, the chip's NeuronLink rate is
assumed), that link's bandwidth shared by the group's ranks on one side of it. Latency, concurrent
groups sharing a link, and overlap with compute are not modelled; the plan says so.
"""
from __future__ import annotations

import html
import json
import os
from collections import Counter, defaultdict

from torch_neuronx.runtime.units import format_bytes, format_seconds, id_ranges as ranges
from torch_neuronx.runtime.hardware import Instance

SCHEMA = 1
# Bytes moved per byte of the call's buffer, as a function of the group's size (ring algorithms).
_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_reduce_coalesced": lambda n: 2 * (n - 1) / n,
    "barrier": lambda n: 0.0, "send": lambda n: 1.0, "recv": lambda n: 1.0,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
}
ASSUMPTIONS = [
    "bandwidth model only: no per-call latency, no overlap with compute, each collective alone on its links",
    "ring algorithms: all_reduce moves 2(n-1)/n of its buffer, all_gather/reduce_scatter/all_to_all (n-1)/n",
    "between two cores of one chip: not published; the chip's NeuronLink bandwidth is assumed",
    "a link's bandwidth is shared evenly by the group's ranks that use it",
]


class DivergenceError(Exception):
    """Ranks of one process group called different collectives."""

    def __init__(self, message: str, details: dict):
        super().__init__(message)
        self.details = details


class Layout:
    """Where each global rank sits: node, chip and logical core of the simulated instances."""

    def __init__(self, instance: Instance, lnc: int, nnodes: int, nproc_per_node: int):
        self.instance, self.lnc, self.nnodes, self.nproc = instance, lnc, nnodes, nproc_per_node
        self.cores_per_chip = instance.chip.physical_cores // lnc

    def node(self, rank: int) -> int:
        return rank // self.nproc

    def chip(self, rank: int) -> int:
        return (rank % self.nproc) // self.cores_per_chip

    def link(self, ranks) -> tuple[str, float]:
        """(the slowest link a group crosses, the bandwidth each of its ranks gets on it)."""
        links = self.instance.links
        nodes = Counter(self.node(r) for r in ranks)
        chips = Counter((self.node(r), self.chip(r)) for r in ranks)
        if len(nodes) > 1:
            if links.ultraserver_nodes >= self.nnodes and links.ultraserver_nodes > 1:
                return "NeuronLink (UltraServer)", links.ultraserver_chip_bytes_per_s / max(chips.values())
            return "EFA", links.efa_bytes_per_s / max(nodes.values())
        if len(chips) > 1:
            return "NeuronLink", links.chip_bytes_per_s / max(chips.values())
        return "on chip (assumed)", links.chip_bytes_per_s / max(1, len(ranks))


def seconds(op: str, nbytes: int, n: int, bandwidth: float) -> float:
    if n <= 1 or bandwidth <= 0:
        return 0.0
    factor = _FACTOR.get(op, lambda n: (n - 1) / n)(n)
    return factor * nbytes / bandwidth


def check_divergence(records) -> dict | None:
    """The first disagreement between the members of a process group, or None.

    Each group's members must make the same calls on it in the same order; ranks of other
    groups legitimately make other calls (tensor-parallel groups 0-7 and 8-15, say)."""
    by_group: dict[tuple, dict[int, list]] = defaultdict(dict)
    for rec in records:
        for index, c in enumerate(rec.collectives):
            if c.ranks:
                by_group[c.ranks].setdefault(rec.rank, []).append((index, c))
    present = {rec.rank for rec in records}
    for group in sorted(by_group, key=lambda g: (-len(g), g)):
        calls = {r: by_group[group].get(r, []) for r in group if r in present}
        signatures = {r: tuple(c.signature() for _, c in seq) for r, seq in calls.items()}
        common, _ = Counter(signatures.values()).most_common(1)[0]
        odd = sorted(r for r, sig in signatures.items() if sig != common)
        if not odd:
            continue
        rank = odd[0]
        mine = signatures[rank]
        at = next((i for i, (a, b) in enumerate(zip(mine, common)) if a != b), min(len(mine), len(common)))
        agreeing = sorted(r for r, sig in signatures.items() if sig == common)
        own = calls[rank][at] if at < len(calls[rank]) else None
        peer = by_group[group][agreeing[0]][at] if at < len(common) else None

        def describe(call):
            return f"{call[1].op}({call[1].shapes}) at {call[1].line or 'an unknown line'}" if call else "nothing"

        message = (f"ranks disagree on their collectives: rank {rank} calls {describe(own)}, where ranks "
                   f"{ranges(agreeing)} call {describe(peer)}; the sequences first differ at collective #{at} "
                   f"on the group of ranks {ranges(group)}")
        if len(odd) > 1:
            message += f"; ranks {ranges(odd)} all differ from the others"
        return {"rank": rank, "ranks": odd, "group": list(group), "index_in_group": at,
                "index_in_rank": own[0] if own else None, "line": own[1].line if own else None,
                "call": describe(own), "others": describe(peer), "message": message}
    return None


def build(records, layout: Layout, capacity: int, script: str, argv, elapsed: float, runs: int) -> dict:
    links = layout.instance.links
    groups: dict[tuple, str] = {}
    group_rows = []
    ranks, over = [], []
    link_totals: dict[str, float] = defaultdict(float)
    for rec in records:
        calls, total = [], 0.0
        for c in rec.collectives:
            if c.ranks not in groups:
                groups[c.ranks] = f"g{len(groups)}"
                link, bw = layout.link(c.ranks)
                group_rows.append({"name": groups[c.ranks], "ranks": ranges(c.ranks), "size": len(c.ranks),
                                   "link": link, "bytes_per_s_per_rank": bw})
            link, bw = layout.link(c.ranks)
            t = seconds(c.op, c.bytes, len(c.ranks), bw)
            total += t
            link_totals[link] += t if rec.rank == 0 else 0.0
            calls.append({"op": c.op, "group": groups[c.ranks], "bytes": c.bytes, "shapes": c.shapes,
                          "line": c.line, "seconds": t})
        entry = {"rank": rec.rank, "node": layout.node(rec.rank), "local_rank": rec.rank % layout.nproc,
                 "chip": layout.chip(rec.rank), "peak_bytes": rec.peak_bytes, "capacity_bytes": capacity,
                 "fits": rec.peak_bytes <= capacity, "allocations": rec.allocations,
                 "communication_seconds": total, "collectives": calls}
        if rec.over is not None:
            entry["over_capacity"] = {"line": rec.over.line, "site": rec.over.site, "op": rec.over.op,
                                      "allocation_bytes": rec.over.allocation, "live_bytes": rec.over.bytes_live}
            over.append({"rank": rec.rank, "peak_bytes": rec.peak_bytes, **entry["over_capacity"]})
        if rec.error:
            entry["error"] = {"message": rec.error, "line": rec.error_line}
        if getattr(rec, "relabelled_from", None) is not None:
            entry["relabelled_from"] = rec.relabelled_from  # not run: that rank's record, groups translated
        ranks.append(entry)
    slowest = max(ranks, key=lambda r: r["communication_seconds"]) if ranks else None
    return {
        "schema": SCHEMA, "mode": "structure", "script": os.path.abspath(script), "args": list(argv),
        "instance": layout.instance.name, "chip": layout.instance.chip.name, "lnc": layout.lnc,
        "nnodes": layout.nnodes, "nproc_per_node": layout.nproc, "world_size": len(records),
        "capacity_bytes": capacity, "ranks": ranks, "over_capacity": over, "groups": group_rows,
        "communication": {
            "slowest_rank": slowest["rank"] if slowest else None,
            "seconds": slowest["communication_seconds"] if slowest else 0.0,
            "rank0_seconds_by_link": dict(link_totals),
            "sources": [links.source], "assumptions": ASSUMPTIONS,
        },
        "divergence": check_divergence(records),
        "simulation": {"elapsed_seconds": elapsed, "script_runs": runs},
    }


def text(plan: dict) -> str:
    out = [f"neuron plan: {os.path.basename(plan['script'])} as {plan['world_size']} ranks on "
           f"{plan['nnodes']} x {plan['instance']} (LNC={plan['lnc']}, {plan['nproc_per_node']} ranks per node)"]
    if plan.get("mode") == "numerics":
        out.append(numerics_text(plan))
        return "\n".join(out) + "\n"
    cap = plan["capacity_bytes"]
    peaks = [r["peak_bytes"] for r in plan["ranks"]]
    out.append(f"HBM per rank: {format_bytes(cap)}; peak {format_bytes(min(peaks))} to {format_bytes(max(peaks))}")
    if plan["divergence"]:
        out.append("ERROR " + plan["divergence"]["message"])
    for o in plan["over_capacity"]:
        out.append(f"OVER HBM: rank {o['rank']} peaks at {format_bytes(o['peak_bytes'])} > {format_bytes(cap)}; "
                   f"crossed by a {format_bytes(o['allocation_bytes'])} allocation ({o['op']}) at "
                   f"{o['line'] or o['site'] or 'an unknown line'}")
    sim = plan.get("simulation", {})
    sym = sim.get("symmetry") or {}
    if sym.get("used"):
        out.append(f"ran {sim['script_runs']} of {plan['world_size']} ranks (0 and the last): the program never used "
                   f"its rank and the last rank's record is rank 0's with its groups translated; the others are "
                   f"rank 0's relabelled (--all-ranks runs each)")
    elif sym.get("why_every_rank_ran"):
        out.append(f"ran every rank: {sym['why_every_rank_ran']}")
    comm = plan["communication"]
    out.append(f"communication: about {format_seconds(comm['seconds'])} on the slowest rank "
               f"({comm['slowest_rank']}) per run of the program, bandwidth only")
    out.append("groups: " + "; ".join(f"{g['name']} = ranks {g['ranks']} over {g['link']}" for g in plan["groups"][:12])
               + (f"; ... {len(plan['groups']) - 12} more" if len(plan["groups"]) > 12 else ""))
    out.append("")
    out.append(f"{'rank':>5} {'node':>4} {'chip':>4} {'peak':>11} {'of HBM':>7} {'collectives':>11} {'comm':>10}")
    for r in plan["ranks"]:
        out.append(f"{r['rank']:>5} {r['node']:>4} {r['chip']:>4} {format_bytes(r['peak_bytes']):>11} "
                   f"{100 * r['peak_bytes'] / cap:>6.1f}% {len(r['collectives']):>11} "
                   f"{format_seconds(r['communication_seconds']):>10}" + ("" if r["fits"] else "  OVER"))
    first = plan["ranks"][0] if plan["ranks"] else None
    if first:
        counted = Counter((c["op"], c["group"], c["bytes"], c["line"]) for c in first["collectives"])
        out += ["", f"rank 0's collectives ({len(first['collectives'])}), grouped:"]
        for (op, group, nbytes, line), n in sorted(counted.items(), key=lambda kv: -kv[1] * kv[0][2])[:20]:
            out.append(f"  {n:>4} x {op} of {format_bytes(nbytes)} on {group} at {line}")
    out += ["", "bandwidth sources: " + "; ".join(comm["sources"]),
            "not modelled: " + "; ".join(comm["assumptions"]),
            "cannot see: real link timing and contention, EFA and placement-group setup, the compiler's NEFFs "
            "and their memory, the runtime's own buffers beyond its fixed reservation"]
    return "\n".join(out) + "\n"


def numerics_text(plan: dict) -> str:
    num = plan["numerics"]
    lines = [f"numerics: {'PASS' if num['ok'] else 'FAIL'} against one device ({num['tolerance']})"]
    for name, row in num["outputs"].items():
        lines.append(f"  {name}: max |difference| over ranks {row['max_abs_difference']:.3g} "
                     f"({'ok' if row['ok'] else 'differs'}; worst rank {row['worst_rank']})")
    return "\n".join(lines)


def page(plan: dict) -> str:
    """A self-contained HTML page of the plan (no scripts, no external files)."""
    e = html.escape
    body = [f"<h1>Neuron plan: {e(os.path.basename(plan['script']))}</h1>",
            f"<pre>{e(text(plan))}</pre>"]
    if plan.get("mode") != "numerics":
        cap = plan["capacity_bytes"]
        rows = "".join(
            f"<tr class='{'over' if not r['fits'] else ''}'><td>{r['rank']}</td><td>{r['node']}</td><td>{r['chip']}</td>"
            f"<td>{e(format_bytes(r['peak_bytes']))}</td><td><div class='bar'><div style='width:"
            f"{min(100, 100 * r['peak_bytes'] / cap):.1f}%'></div></div></td><td>{len(r['collectives'])}</td>"
            f"<td>{e(format_seconds(r['communication_seconds']))}</td></tr>" for r in plan["ranks"])
        body.append("<table><tr><th>rank</th><th>node</th><th>chip</th><th>peak</th><th>of "
                    f"{e(format_bytes(cap))}</th><th>collectives</th><th>communication</th></tr>{rows}</table>")
    style = ("body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em;overflow:auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
             ".bar{width:160px;background:#eee}.bar div{background:#4a7;height:10px}tr.over .bar div{background:#c33}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>neuron plan</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")


def write(plan: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "plan.json"), "w") as f:
        json.dump(plan, f, indent=1)
    with open(os.path.join(out_dir, "plan.txt"), "w") as f:
        f.write(text(plan))
    with open(os.path.join(out_dir, "plan.html"), "w") as f:
        f.write(page(plan))
    return out_dir
