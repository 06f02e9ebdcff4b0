"""The plan (:class:`Plan`): each rank's peak memory against its core's HBM, its collectives, its time on Trainium
(compute, launches and collectives, per marked step), and whether the ranks agree on their
collectives. Built from the ranks' records (:func:`build`), or again from a written plan for
another instance (:func:`recost`); rendered by :mod:`.render`.

Time follows :mod:`torch_neuronx.diagnostics.time_model`, the model the readiness report uses:
a rank's op calls costed on its logical core (eager calls each launched, compiled graphs fused),
each collective its ring steps' latency plus its bytes over the slowest link its group crosses
(between instances: EFA, or NeuronLink inside an UltraServer; between chips: NeuronLink; inside
a chip: unpublished, the chip's NeuronLink rate is assumed), that link's bandwidth shared by the
group's ranks on one side of it.
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter, defaultdict

from torch_neuronx.diagnostics import cost_model, time_model
from torch_neuronx.runtime.hardware import Instance
from torch_neuronx.runtime.units import id_ranges as ranges

SCHEMA = 2  # 2: time (compute, launches, collectives' latency), steps, grouped collectives, recorded work
LINK_ASSUMPTIONS = [
    "between two cores of one chip: not published; the chip's NeuronLink bandwidth is assumed",
    "a link's bandwidth is shared evenly by the group's ranks that use it; groups running at once on one link "
    "do not slow each other",
]


@dataclasses.dataclass
class Plan:
    """A structure plan (``python -m torch_neuronx.simulate``'s default mode): the job's time, each
    rank's row (``ranks``: memory, time, collectives), the ranks over their HBM, the process
    groups, the communication summary, the ranks' disagreement if any (``divergence``), how the
    simulation ran, and what re-costing needs (``recorded``). :meth:`to_json` is plan.json."""

    script: str
    args: list
    instance: str
    chip: str
    lnc: int
    nnodes: int
    nproc_per_node: int
    world_size: int
    capacity_bytes: int
    time: dict
    ranks: list
    over_capacity: list
    groups: list
    communication: dict
    divergence: dict | None
    simulation: dict
    recorded: dict
    schema: int = SCHEMA
    mode: str = "structure"

    def to_json(self) -> dict:
        """plan.json: the fields, schema and mode first."""
        fields = [f.name for f in dataclasses.fields(self)]
        return {name: getattr(self, name) for name in ["schema", "mode", *fields[:-2]]}


class Layout:
    """Where each global rank sits: node, chip and logical core of the simulated instances."""

    def __init__(self, instance: Instance, lnc: int, nnodes: int, nproc_per_node: int):
        self.instance, self.lnc, self.nnodes, self.nproc = instance, lnc, nnodes, nproc_per_node
        self.cores_per_chip = instance.chip.physical_cores // lnc
        self._links: dict[tuple, tuple[str, float]] = {}

    def node(self, rank: int) -> int:
        return rank // self.nproc

    def chip(self, rank: int) -> int:
        return (rank % self.nproc) // self.cores_per_chip

    def link(self, ranks) -> tuple[str, float]:
        """(the slowest link a group crosses, the bandwidth each of its ranks gets on it)."""
        ranks = tuple(ranks)
        if ranks not in self._links:
            self._links[ranks] = self._link(ranks)
        return self._links[ranks]

    def _link(self, ranks) -> tuple[str, float]:
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


# ---- the records, as the plan costs them --------------------------------------------------------
def grouped_collectives(rec) -> dict[tuple, int]:
    """{(op, ranks, bytes, shapes, line, step): calls} of a record, in the order first called;
    a relabelled record's groups translated (symmetry.relabel_lightly)."""
    cached = getattr(rec, "grouped", None)
    if cached is None:  # once per record: a decode of 1,500 steps makes 243,000 calls
        cached = rec.grouped = {}
        for c in rec.collectives:
            key = (c.op, c.ranks, c.bytes, c.shapes, c.line, c.step)
            cached[key] = cached.get(key, 0) + 1
    translate = getattr(rec, "group_map", None)
    if not translate:
        return cached
    return {(op, translate.get(g, g), b, s, line, step): n for (op, g, b, s, line, step), n in cached.items()}


def _compute_spans(profile, rec, cal) -> dict:
    """{step: Span} of a record's op calls and launches (no collectives yet)."""
    spans = {}
    for step in set(rec.work) | set(rec.launches):
        launches = rec.launches.get(step, {})
        spans[step] = time_model.Span(time_model.work_span(profile, Counter(rec.work.get(step, {})), cal),
                                      launches.get("eager", 0), launches.get("graph", 0))
    return spans


def _seconds_pair(span: time_model.Span, cal, per: int = 1) -> list[float]:
    return [s / per for s in span.seconds(cal)]


def _step_rows(spans: dict, steps: dict, cal) -> dict:
    """Each marked step's time: per step (the mean over its calls), per token or sequence."""
    rows = {}
    for name, info in steps.items():
        span, count = spans.get(name, time_model.Span()), max(1, info["count"])
        row = {"count": info["count"], "tokens": info["tokens"], "sequences": info["sequences"],
               "seconds": _seconds_pair(span, cal, count), "compute_seconds": span.compute_s / count,
               "launch_seconds": [s / count for s in span.launch_s(cal)],
               "eager_launches": span.eager_launches / count, "graph_launches": span.graph_launches / count,
               "communication_seconds": span.comm_s / count, "communication_latency_seconds":
                   span.comm_latency_s / count}
        for unit in ("tokens", "sequences"):
            if info[unit]:
                row[f"per_{unit[:-1]}_seconds"] = _seconds_pair(span, cal, count * info[unit])
                row[f"{unit}_per_second"] = [info[unit] / s if s else 0.0 for s in reversed(row["seconds"])]
        rows[name] = row
    return rows


class _Groups:
    """The process groups met so far, each named g0, g1, ... in the order first seen."""

    def __init__(self, layout: Layout):
        self.layout, self.names, self.rows = layout, {}, []

    def name(self, group: tuple) -> str:
        if group not in self.names:
            self.names[group] = f"g{len(self.names)}"
            link, bw = self.layout.link(group)
            self.rows.append({"name": self.names[group], "ranks": ranges(group), "size": len(group),
                              "link": link, "bytes_per_s_per_rank": bw})
        return self.names[group]


def _costed_collectives(rec, spans: dict, groups: _Groups, cal: time_model.Calibration) -> list[dict]:
    """Each distinct collective call of a rank, timed on its group's link; its time goes to its step's span."""
    calls = []
    for (op, group, nbytes, shapes, line, step), n in grouped_collectives(rec).items():
        name = groups.name(group)
        link, bw = groups.layout.link(group)
        latency, transfer = time_model.collective_seconds(op, nbytes, len(group), bw, link, cal)
        span = spans.setdefault(step, time_model.Span())
        span.comm_latency_s += n * latency
        span.comm_transfer_s += n * transfer
        calls.append({"op": op, "group": name, "bytes": nbytes, "shapes": shapes, "line": line,
                      "step": step, "calls": n, "seconds": latency + transfer})
    return calls


def _overlap_calls(rec, backward: dict) -> list[tuple[str, tuple, int, str | None]]:
    """(op, ranks, bytes, line) of each collective a backward launched without waiting for it, its
    group translated for a relabelled rank. A run record holds indices into its collectives, a
    re-costed one the calls themselves."""
    translate = getattr(rec, "group_map", None) or {}
    calls = []
    for call in backward["calls"]:
        if isinstance(call, int):
            c = rec.collectives[call]
            call = (c.op, c.ranks, c.bytes, c.line)
        op, ranks, nbytes, line = call
        calls.append((op, translate.get(tuple(ranks), tuple(ranks)), nbytes, line))
    return calls


def _compute_after(profile, backward: dict, cal) -> list[float]:
    """The compute seconds (work and launches, at the low launch cost) left after each launch."""
    costs = [time_model.work_span(profile, Counter(seg["work"]), cal) + seg["eager"] * cal.eager_launch_s[0]
             + seg["graph"] * cal.graph_launch_s[0] for seg in backward["segments"]]
    return [sum(costs[i:]) for i in range(len(costs))]


def _hidden(rec, spans: dict, layout: Layout, profile, cal, cache: dict) -> list[dict]:
    """Each backward's collectives that run under its compute (DDP's buckets): their time hidden
    goes to the step's span; returns what the plan lists of them."""
    listed = []
    for backward in getattr(rec, "overlaps", None) or []:
        if id(backward) not in cache:  # relabelled ranks share rank 0's backwards
            cache[id(backward)] = _compute_after(profile, backward, cal)
        calls, after = _overlap_calls(rec, backward), cache[id(backward)]
        seconds = [sum(time_model.collective_seconds(op, nbytes, len(ranks), layout.link(ranks)[1],
                                                     layout.link(ranks)[0], cal)) for op, ranks, nbytes, _ in calls]
        hidden = time_model.overlapped_seconds(zip(seconds, after))
        spans.setdefault(backward["step"], time_model.Span()).hidden_s += hidden
        listed.append({"step": backward["step"], "hidden_seconds": hidden, "exposed_seconds": sum(seconds) - hidden,
                       "calls": [{"op": op, "ranks": ranges(ranks), "bytes": nbytes, "line": line, "seconds": t,
                                  "compute_after_seconds": a}
                                 for (op, ranks, nbytes, line), t, a in zip(calls, seconds, after)]})
    return listed


def _over_capacity(rec, capacity: int) -> dict | None:
    """Where a rank's memory crossed the core's HBM (unknown when re-costed for a smaller one)."""
    if rec.over is not None and rec.over.bytes_live > capacity:
        return {"line": rec.over.line, "site": rec.over.site, "op": rec.over.op,
                "allocation_bytes": rec.over.allocation, "live_bytes": rec.over.bytes_live}
    if rec.peak_bytes > capacity:
        return {"line": None, "site": None, "op": None, "allocation_bytes": None, "live_bytes": rec.peak_bytes}
    return None


def _rank_entry(rec, spans: dict, calls: list[dict], layout: Layout, capacity: int,
                cal: time_model.Calibration) -> dict:
    """One rank's row of the plan: where it runs, its memory, its time and its collectives."""
    whole = time_model.Span()
    for span in spans.values():
        whole.add(span)
    entry = {"rank": rec.rank, "node": layout.node(rec.rank), "local_rank": rec.rank % layout.nproc,
             "chip": layout.chip(rec.rank), "peak_bytes": rec.peak_bytes, "capacity_bytes": capacity,
             "fits": rec.peak_bytes <= capacity, "allocations": rec.allocations,
             "step_seconds": list(whole.seconds(cal)), "compute_seconds": whole.compute_s,
             "launch_seconds": list(whole.launch_s(cal)), "eager_launches": whole.eager_launches,
             "graph_launches": whole.graph_launches, "communication_seconds": whole.comm_s,
             "communication_latency_seconds": whole.comm_latency_s, "communication_hidden_seconds": whole.hidden_s,
             "collective_calls": sum(c["calls"] for c in calls), "collectives": calls,
             "steps": _step_rows(spans, rec.steps, cal)}
    over = _over_capacity(rec, capacity)
    if over is not None:
        entry["over_capacity"] = over
    if rec.error:
        entry["error"] = {"message": rec.error, "line": rec.error_line}
    if getattr(rec, "relabelled_from", None) is not None:
        entry["relabelled_from"] = rec.relabelled_from  # not run: that rank's record, groups translated
    return entry


def build(records, layout: Layout, capacity: int, script: str, argv, elapsed: float, runs: int,
          divergence: dict | None = None, cal: time_model.Calibration = time_model.CALIBRATION) -> Plan:
    """The plan of ``records`` on ``layout``, timed with ``cal``. ``divergence``,
    when given, is taken as found (re-costing a plan); else the records are checked."""
    profile = cost_model.profile_for(layout.instance.chip.name, layout.lnc)
    groups = _Groups(layout)
    ranks, recorded = [], {}
    compute_cache: dict[int, dict] = {}  # ranks that share their work share its costing
    after_cache: dict[int, list] = {}
    overlapped = {}  # rank -> each backward's DDP buckets (bytes, line, time hidden); rank 0's is shown
    for rec in records:
        if id(rec.work) not in compute_cache:
            compute_cache[id(rec.work)] = _compute_spans(profile, rec, cal)
        spans = {step: time_model.Span(**vars(span)) for step, span in compute_cache[id(rec.work)].items()}
        calls = _costed_collectives(rec, spans, groups, cal)
        overlapped[rec.rank] = _hidden(rec, spans, layout, profile, cal, after_cache)
        ranks.append(_rank_entry(rec, spans, calls, layout, capacity, cal))
        if "relabelled_from" not in ranks[-1]:
            recorded[str(rec.rank)] = record_json(rec)
    checked = [rec for rec in records if getattr(rec, "relabelled_from", None) is None]
    over = [{"rank": r["rank"], "peak_bytes": r["peak_bytes"], **r["over_capacity"]} for r in ranks
            if "over_capacity" in r]
    return Plan(
        script=os.path.abspath(script), args=list(argv), instance=layout.instance.name,
        chip=layout.instance.chip.name, lnc=layout.lnc, nnodes=layout.nnodes, nproc_per_node=layout.nproc,
        world_size=len(records), capacity_bytes=capacity,
        time=time_summary(ranks, profile, layout, cal, overlapped.get(0, [])),
        ranks=ranks, over_capacity=over, groups=groups.rows,
        communication={
            "slowest_rank": max(ranks, key=lambda r: r["communication_seconds"])["rank"] if ranks else None,
            "seconds": max((r["communication_seconds"] for r in ranks), default=0.0),
            "sources": [layout.instance.links.source], "assumptions": LINK_ASSUMPTIONS,
        },
        divergence=divergence if divergence is not None else check_divergence(checked),
        simulation={"elapsed_seconds": elapsed, "script_runs": runs},
        recorded=recorded,
    )


def time_summary(ranks: list[dict], profile, layout: Layout, cal: time_model.Calibration,
                 backward_overlap: list[dict]) -> dict:
    """The job's time: the slowest rank's (ranks wait for each other at their collectives); rank
    0's backwards with the collectives they run under their compute (DDP's buckets)."""
    if not ranks:
        return {}
    slowest = max(ranks, key=lambda r: r["step_seconds"][1])
    return {"step_seconds": [max(r["step_seconds"][0] for r in ranks), slowest["step_seconds"][1]],
            "slowest_rank": slowest["rank"], "steps": slowest["steps"], "profile": profile.as_dict(),
            "calibration": cal.as_dict(), "assumptions": time_model.assumptions(cal),
            "sources": [profile.source, layout.instance.links.source], "backward_overlap": backward_overlap}


# ---- what a plan keeps to be re-costed ----------------------------------------------------------
def record_json(rec) -> dict:
    """What re-costing a run rank needs beyond its entry: its op calls' work, launches and steps."""
    def steps_of(table):
        return [{"step": step, "items": items} for step, items in table.items()]

    overlaps = [{"step": b["step"], "calls": [list(call) for call in _overlap_calls(rec, b)],
                 "segments": [{**seg, "work": [[p, f, n_bytes, n] for (p, f, n_bytes), n in seg["work"].items()]}
                              for seg in b["segments"]]} for b in getattr(rec, "overlaps", None) or []]
    return {"work": steps_of({s: [[p, f, b, n] for (p, f, b), n in w.items()] for s, w in rec.work.items()}),
            "launches": steps_of(rec.launches), "steps": rec.steps, "overlaps": overlaps}


def _overlaps_of(recorded: dict) -> list[dict]:
    """record_json's overlaps back as a record holds them (its calls resolved, not indices)."""
    return [{"step": b["step"], "calls": [(op, tuple(ranks), n_bytes, line) for op, ranks, n_bytes, line in b["calls"]],
             "segments": [{**seg, "work": {tuple(item[:3]): item[3] for item in seg["work"]}} for seg in b["segments"]]}
            for b in recorded.get("overlaps", [])]


def recost(old: dict, layout: Layout, capacity: int, source: str,
           cal: time_model.Calibration = time_model.CALIBRATION) -> Plan:
    """A written plan (plan.json, schema 2) costed again on ``layout``: its ranks' recorded work,
    launches and collectives, nothing run again. Peaks are checked against the new ``capacity``;
    the ranks' agreement is instance-independent and kept."""
    from torch_neuronx.simulate.recorder import RankRecord

    check_recostable(old, source)
    if len(old["ranks"]) != layout.nnodes * layout.nproc:
        raise ValueError(f"{source} has {len(old['ranks'])} ranks, but {layout.nnodes} x {layout.nproc} were asked "
                         "for: re-cost with the plan's own --nnodes and --nproc-per-node")
    group_ranks = {g["name"]: _parse_ranges(g["ranks"]) for g in old["groups"]}
    records, base = [], {}
    for entry in old["ranks"]:
        rec = RankRecord(entry["rank"], entry["peak_bytes"], allocations=entry["allocations"])
        source_rank = str(entry.get("relabelled_from", entry["rank"]))
        kept = base.get(source_rank)
        if kept is None:
            recorded = old["recorded"][source_rank]
            kept = base[source_rank] = (
                {s["step"]: {tuple(item[:3]): item[3] for item in s["items"]} for s in recorded["work"]},
                {s["step"]: s["items"] for s in recorded["launches"]}, recorded["steps"], _overlaps_of(recorded))
        rec.work, rec.launches, rec.steps, rec.overlaps = kept
        rec.grouped = {(c["op"], group_ranks[c["group"]], c["bytes"], c["shapes"], c["line"], c["step"]): c["calls"]
                       for c in entry["collectives"]}
        rec.relabelled_from = entry.get("relabelled_from")
        if "error" in entry:
            rec.error, rec.error_line = entry["error"]["message"], entry["error"]["line"]
        over = entry.get("over_capacity")
        if over and over.get("allocation_bytes"):
            from torch_neuronx.simulate.recorder import OverCapacity

            rec.over = OverCapacity(over["live_bytes"], over["allocation_bytes"], over["op"], over["line"],
                                    over["site"])
        records.append(rec)
    result = build(records, layout, capacity, old["script"], old["args"], 0.0, old["simulation"]["script_runs"],
                   divergence=old["divergence"], cal=cal)
    result.simulation = {**old["simulation"], "recosted_from": os.path.abspath(source),
                            "recorded_on": f"{old['nnodes']} x {old['instance']} (LNC={old['lnc']})"}
    return result


def check_recostable(old, source: str) -> None:
    """Raise ValueError, naming the fix, unless ``old`` is a plan :func:`recost` can read."""
    if not isinstance(old, dict) or old.get("schema") != SCHEMA or old.get("mode") != "structure" \
            or "recorded" not in old:
        described = (f"schema {old.get('schema')!r}, mode {old.get('mode')!r}" if isinstance(old, dict)
                     else type(old).__name__)
        raise ValueError(f"{source} is not a plan this version can re-cost ({described}; re-costing needs a "
                         f"structure plan of schema {SCHEMA}): run the simulation again to write one")


def _parse_ranges(text: str) -> tuple[int, ...]:
    """'0-3,6' -> (0, 1, 2, 3, 6): the inverse of id_ranges, in the group's own order."""
    out = []
    for part in text.split(","):
        if part in ("-", ""):
            continue
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return tuple(out)
