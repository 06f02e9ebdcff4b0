"""The plan (:class:`Plan`): each rank's peak memory against its core's HBM, its collectives, its time on Trainium
(compute, launches and collectives, per marked step), and whether the ranks agree on their
collectives. Built from the ranks' records (:func:`build`), or again from a written plan for
another instance (:func:`recost`); rendered by :mod:`.render`.

Time follows :mod:`torch_neuronx.trainium.time_model`, the model the readiness report uses:
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
from typing import NamedTuple

from torch_neuronx.trainium import cost_model, time_model
from torch_neuronx.runtime.hardware import Instance
from torch_neuronx.runtime.units import id_ranges as ranges
from torch_neuronx.simulate import costing, recorded, render
from torch_neuronx.simulate.rows import (Communication, CollectiveRow, Crossing, Divergence, GroupRow, OverCapacityRow,
                                         PlanTime, RankError, RankRow, Simulation, StepRow)
from torch_neuronx.runtime.rows import rows_of

# 3: one estimate per step (seconds) with its interval and bounds; 2: a [low, high] range, steps,
# grouped collectives, recorded work. --recost reads both (recorded.RECOSTABLE).
SCHEMA = 3
LINK_ASSUMPTIONS = [
    "between two cores of one chip: not published; the chip's NeuronLink bandwidth is assumed",
    "a link's bandwidth is shared evenly by the group's ranks that use it; groups running at once on one link "
    "do not slow each other",
]


@dataclasses.dataclass
class Plan(render.PlanFiles):
    """A structure plan (``python -m torch_neuronx.simulate``'s default mode): the job's time, each
    rank's row (``ranks``: memory, time, collectives), the ranks over their HBM, the process
    groups, the communication summary, the ranks' disagreement if any (``divergence``), how the
    simulation ran, and what re-costing needs (``recorded``); its files as :class:`.render.PlanFiles` writes them."""

    script: str
    args: list
    instance: str
    chip: str
    lnc: int
    nnodes: int
    nproc_per_node: int
    world_size: int
    capacity_bytes: int
    time: PlanTime | None  # None (``{}`` in the JSON) when there are no ranks
    ranks: list[RankRow]
    over_capacity: list[OverCapacityRow]
    groups: list[GroupRow]
    communication: Communication
    divergence: Divergence | None
    simulation: Simulation
    recorded: dict  # str(rank) -> recorded.record_json of each run rank
    schema: int = SCHEMA
    mode: str = "structure"

    nested = {"time": lambda t: PlanTime.from_dict(t) if t else None, "ranks": rows_of(RankRow),
              "over_capacity": rows_of(OverCapacityRow), "groups": rows_of(GroupRow),
              "communication": Communication.from_dict, "divergence": Divergence.from_dict,
              "simulation": Simulation.from_dict}

    def to_dict(self) -> dict:
        out = super().to_dict()
        return out if self.time is not None else {**out, "time": {}}


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


def check_divergence(records) -> Divergence | None:
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
        return Divergence(rank=rank, ranks=odd, group=list(group), index_in_group=at,
                          index_in_rank=own[0] if own else None, line=own[1].line if own else None,
                          call=describe(own), others=describe(peer), message=message)
    return None


# ---- the records' time, as the plan gives it -----------------------------------------------------
class Timing(NamedTuple):
    seconds: float
    interval_seconds: list[float]
    bounds_seconds: list[float]


def timing(span: time_model.Span, cal: time_model.Calibration, per: int = 1) -> Timing:
    """A span's estimate, its interval (the model's out-of-sample error) and its bounds (every
    collective hidden, none), each divided by ``per``."""
    point = span.seconds(cal) / per
    return Timing(point, list(cal.interval(point)), [s / per for s in span.bounds(cal)])


def _parts(span: time_model.Span, cal, per: int) -> dict:
    """What a span's estimate is made of, each divided by ``per``: the mechanisms the plan names (the
    fields StepRow and RankRow share, as keyword arguments)."""
    return {"compute_seconds": span.compute_s / per, "launch_seconds": span.launch_s(cal) / per,
            "eager_launches": span.eager_launches / per, "graph_launches": span.graph_launches / per,
            "communication_seconds": span.comm_s / per, "communication_latency_seconds": span.comm_latency_s / per,
            "communication_fixed_seconds": span.comm_calls * cal.collective_s / per,
            "communication_hidden_seconds": span.hidden_s / per, "collective_calls": span.comm_calls / per}


def _per_unit(span: time_model.Span, cal, count: int, amounts: dict) -> dict:
    """A step's time per token and per sequence (those it counts), as StepRow's keyword arguments."""
    out = {}
    for unit, amount in amounts.items():
        if amount:
            per = timing(span, cal, count * amount)
            out.update({f"per_{unit[:-1]}_seconds": per.seconds,
                        f"per_{unit[:-1]}_interval_seconds": per.interval_seconds,
                        f"{unit}_per_second": 1 / per.seconds if per.seconds else 0.0,
                        f"{unit}_per_second_interval": [1 / s if s else 0.0 for s in reversed(per.interval_seconds)]})
    return out


def _step_rows(spans: dict, steps: dict, cal) -> dict[str, StepRow]:
    """Each marked step's time: per step (the mean over its calls), per token or sequence."""
    rows = {}
    for name, info in steps.items():
        span, count = spans.get(name, time_model.Span()), max(1, info.count)
        amounts = {"tokens": info.tokens, "sequences": info.sequences}
        rows[name] = StepRow(info.count, **amounts, **timing(span, cal, count)._asdict(),
                             **_parts(span, cal, count), **_per_unit(span, cal, count, amounts))
    return rows


class _Groups:
    """The process groups met so far, each named g0, g1, ... in the order first seen."""

    def __init__(self, layout: Layout):
        self.layout, self.names, self.rows = layout, {}, []

    def name(self, group: tuple) -> str:
        if group not in self.names:
            self.names[group] = f"g{len(self.names)}"
            link, bw = self.layout.link(group)
            self.rows.append(GroupRow(self.names[group], ranges(group), len(group), link, bw))
        return self.names[group]


def _over_capacity(rec, capacity: int) -> Crossing | None:
    """Where a rank's memory crossed the core's HBM (unknown when re-costed for a smaller one)."""
    if rec.over is not None and rec.over.bytes_live > capacity:
        return Crossing(rec.over.line, rec.over.site, rec.over.op, rec.over.allocation, rec.over.bytes_live)
    if rec.peak_bytes > capacity:
        return Crossing(None, None, None, None, rec.peak_bytes)
    return None


def _rank_entry(rec, spans: dict, calls: list[CollectiveRow], layout: Layout, capacity: int,
                cal: time_model.Calibration) -> RankRow:
    """One rank's row of the plan: where it runs, its memory, its time and its collectives."""
    whole = time_model.Span()
    for span in spans.values():
        whole.add(span)
    run = timing(whole, cal)
    parts = {**_parts(whole, cal, 1), "collective_calls": sum(c.calls for c in calls)}
    return RankRow(
        rank=rec.rank, node=layout.node(rec.rank), local_rank=rec.rank % layout.nproc, chip=layout.chip(rec.rank),
        peak_bytes=rec.peak_bytes, capacity_bytes=capacity, fits=rec.peak_bytes <= capacity,
        allocations=rec.allocations, step_seconds=run.seconds, step_interval_seconds=run.interval_seconds,
        step_bounds_seconds=run.bounds_seconds, **parts, collectives=calls, steps=_step_rows(spans, rec.steps, cal),
        over_capacity=_over_capacity(rec, capacity),
        error=RankError(rec.error, rec.error_line) if rec.error else None,
        relabelled_from=getattr(rec, "relabelled_from", None))


def build(records, layout: Layout, capacity: int, script: str, argv, simulation: Simulation,
          divergence: Divergence | None = None, cal: time_model.Calibration = time_model.CALIBRATION) -> Plan:
    """The plan of ``records`` on ``layout``, timed with ``cal``. ``simulation`` says how they were had
    (elapsed seconds, script runs, ...: the engine's, or the re-costed plan's). ``divergence``, when
    given, is taken as found (re-costing a plan); else the records are checked."""
    profile = cost_model.profile_for(layout.instance.chip.name, layout.lnc)
    groups = _Groups(layout)
    ranks, kept = [], {}
    compute_cache: dict[int, dict] = {}  # ranks that share their work share its costing
    after_cache: dict[int, list] = {}
    overlapped = {}  # rank -> each backward's DDP buckets (bytes, line, time hidden); rank 0's is shown
    for rec in records:
        spans, calls, overlapped[rec.rank] = costing.rank_spans(rec, layout, profile, cal, compute_cache,
                                                                after_cache, groups.name)
        ranks.append(_rank_entry(rec, spans, calls, layout, capacity, cal))
        if ranks[-1].relabelled_from is None:
            kept[str(rec.rank)] = recorded.record_json(rec)
    checked = [rec for rec in records if getattr(rec, "relabelled_from", None) is None]
    return Plan(
        script=os.path.abspath(script), args=list(argv), instance=layout.instance.name,
        chip=layout.instance.chip.name, lnc=layout.lnc, nnodes=layout.nnodes, nproc_per_node=layout.nproc,
        world_size=len(records), capacity_bytes=capacity,
        time=time_summary(ranks, profile, layout, cal, overlapped.get(0, [])),
        ranks=ranks, over_capacity=_over_rows(ranks), groups=groups.rows,
        communication=Communication(
            slowest_rank=max(ranks, key=lambda r: r.communication_seconds).rank if ranks else None,
            seconds=max((r.communication_seconds for r in ranks), default=0.0),
            sources=[layout.instance.links.source], assumptions=LINK_ASSUMPTIONS),
        divergence=divergence if divergence is not None else check_divergence(checked),
        simulation=simulation,
        recorded=kept,
    )


def _over_rows(ranks: list[RankRow]) -> list[OverCapacityRow]:
    """The ranks over their core's HBM, and where each crossed."""
    return [OverCapacityRow(r.rank, r.peak_bytes, o.line, o.site, o.op, o.allocation_bytes, o.live_bytes)
            for r in ranks if (o := r.over_capacity) is not None]


def time_summary(ranks: list[RankRow], profile, layout: Layout, cal: time_model.Calibration,
                 backward_overlap: list) -> PlanTime | None:
    """The job's time: the slowest rank's (ranks wait for each other at their collectives); rank
    0's backwards with the collectives they run under their compute (DDP's buckets)."""
    if not ranks:
        return None
    slowest = max(ranks, key=lambda r: r.step_seconds)
    return PlanTime(
        step_seconds=slowest.step_seconds, interval_seconds=list(cal.interval(slowest.step_seconds)),
        bounds_seconds=[max(r.step_bounds_seconds[0] for r in ranks), slowest.step_bounds_seconds[1]],
        slowest_rank=slowest.rank, steps=slowest.steps, profile=profile.as_dict(), calibration=cal.as_dict(),
        assumptions=time_model.assumptions(cal), sources=[profile.source, layout.instance.links.source],
        backward_overlap=backward_overlap)


def recost(old: recorded.RecordedPlan, layout: Layout, capacity: int, source: str,
           cal: time_model.Calibration = time_model.CALIBRATION) -> Plan:
    """A written plan (plan.json, schema 2 or 3, read by :func:`.recorded.read`) costed again on
    ``layout``: its ranks' recorded work, launches and collectives, nothing run again. Peaks are
    checked against the new ``capacity``; the ranks' agreement is instance-independent and kept."""
    if len(old.ranks) != layout.nnodes * layout.nproc:
        raise ValueError(f"{source} has {len(old.ranks)} ranks, but {layout.nnodes} x {layout.nproc} were asked "
                         "for: re-cost with the plan's own --nnodes and --nproc-per-node")
    groups, base = recorded.group_ranks_of(old), {}
    records = [recorded.recorded_record(old, entry, groups, base) for entry in old.ranks]
    simulation = dataclasses.replace(old.simulation, recosted_from=os.path.abspath(source),
                                     recorded_on=f"{old.nnodes} x {old.instance} (LNC={old.lnc})",
                                     recorded_schema=old.schema)
    return build(records, layout, capacity, old.script, old.args, simulation, divergence=old.divergence, cal=cal)
