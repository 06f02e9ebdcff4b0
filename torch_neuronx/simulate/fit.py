"""The time model's unpublished constants fitted to AWS's published rows (:mod:`.calibration`),
and the model's out-of-sample error: each row predicted by constants fitted to the other rows
(leave one out).

A row's prediction is its program's plan re-costed (as :func:`.costing.rank_spans` costs rank
0's record: every rank of these programs does the same) with the constants being tried, nothing run
again; the record is split once into parts that each scale with one constant (:class:`Terms`), so a
try costs a millisecond, not a full costing's tens (a test holds the two equal). The fit minimizes
the sum of the squared log ratios (prediction / AWS's figure) over the rows, by Nelder and Mead's
search (:mod:`.minimize`) over the constants' logarithms; a fraction cannot pass 1 (a penalty).
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

from torch_neuronx.trainium import cost_model, time_model
from torch_neuronx.trainium import calibration
from torch_neuronx.simulate import costing, minimize, plan as plans, recorded

# The fitted constants, each a (name, read, write) of the Calibration: the others are assumed.
FITTED = (
    ("compute fraction", lambda c: c.compute_fraction, lambda c, v: dataclasses.replace(c, compute_fraction=v)),
    ("HBM fraction", lambda c: c.hbm_fraction, lambda c, v: dataclasses.replace(c, hbm_fraction=v)),
    ("Trainium NeuronLink fraction", lambda c: c.link_fraction["Trainium"],
     lambda c, v: dataclasses.replace(c, link_fraction={**c.link_fraction, "Trainium": v})),
    ("Trainium2 NeuronLink fraction", lambda c: c.link_fraction["Trainium2"],
     lambda c, v: dataclasses.replace(c, link_fraction={**c.link_fraction, "Trainium2": v})),
    ("collective fixed cost (s)", lambda c: c.collective_s, lambda c, v: dataclasses.replace(c, collective_s=v)),
    ("NeuronLink ring step latency (s)", lambda c: c.step_latency_s[time_model.NEURONLINK],
     lambda c, v: dataclasses.replace(c, step_latency_s={**c.step_latency_s, time_model.NEURONLINK: v})),
)
# Where the search starts, besides the current constants: middling fractions, a collective's fixed
# cost of tens of microseconds and a ring step of a tenth of one (the fit has more than one valley).
STARTS = ((0.7, 0.8, 0.4, 0.4, 50e-6, 0.1e-6), (0.5, 0.6, 0.2, 0.6, 20e-6, 0.5e-6))
FRACTIONS = 4  # the first four are fractions of a published peak: at most 1


# Constants of one: each part of a cost then comes out of time_model's own formulas alone.
UNIT = dataclasses.replace(time_model.CALIBRATION, compute_fraction=1.0, hbm_fraction=1.0, collective_s=1.0,
                           link_fraction=dict.fromkeys(time_model.CALIBRATION.link_fraction, 1.0),
                           step_latency_s=dict.fromkeys(time_model.CALIBRATION.step_latency_s, 0.0))


def _work_terms(profile, work: dict) -> list[tuple[int, float, float]]:
    """(calls, FLOPs over the peak, bytes over the HBM bandwidth) of each of ``work``'s keys."""
    return [(n, time_model.work_seconds(profile, p, f, 0, UNIT), time_model.work_seconds(profile, p, 0, b, UNIT))
            for (p, f, b), n in work.items()]


def _collective_terms(op: str, group: tuple, nbytes: int, layout) -> tuple:
    """(fixed costs, ring steps, link kind, bytes over the link's bandwidth, link) of one call."""
    fixed, transfer = costing.collective_seconds(op, group, nbytes, layout, UNIT)
    link = layout.link(group)[0]
    kind = time_model.link_kind(link)
    steps = costing.collective_seconds(op, group, nbytes, layout, dataclasses.replace(
        UNIT, collective_s=0.0, step_latency_s={**UNIT.step_latency_s, kind: 1.0}))[0]
    return fixed, steps, kind, transfer, link


class Terms:
    """A record's step costed in parts that each scale with one constant, so that the fit's
    thousands of tries cost microseconds: the work's FLOPs over the peak and bytes over the HBM
    bandwidth (numpy arrays), its launches, and its collectives' calls (fixed cost), ring steps (by
    link kind) and bytes over each link's bandwidth."""

    def __init__(self, rec, layout, profile, step: str):
        import numpy as np

        terms = _work_terms(profile, rec.work.get(step, {}))
        self.calls, self.flop_s, self.byte_s = (np.array([t[i] for t in terms], dtype=float) for i in range(3))
        launches = rec.launches.get(step, {})
        self.eager, self.graphs = launches.get("eager", 0), launches.get("graph", 0)
        self.fixed, self.ring, self.transfer = 0, Counter(), Counter()
        for (op, group, nbytes, _, _, at), n in costing.grouped_collectives(rec).items():
            if at == step:
                fixed, steps, kind, transfer, link = _collective_terms(op, group, nbytes, layout)
                self.fixed += n * fixed
                self.ring[kind] += n * steps
                self.transfer[link] += n * transfer

    def seconds(self, cal: time_model.Calibration, chip: str) -> float:
        """Compute, launches and collectives, before what the collectives hide."""
        import numpy as np

        work = float(np.dot(self.calls, np.maximum(self.flop_s / cal.compute_fraction, self.byte_s / cal.hbm_fraction)))
        comm = (self.fixed * cal.collective_s + sum(n * cal.step_latency_s[k] for k, n in self.ring.items())
                + sum(t / cal.link(link, chip) for link, t in self.transfer.items()))
        return work + time_model.launches_seconds(self.eager, self.graphs, cal) + comm


class GraphTerms:
    """A compiled graph's overlap entry (costing.graph_hidden) with its events' work and
    collectives costed in parts (as :class:`Terms`): the schedule is run again at each try."""

    def __init__(self, entry, rec, layout, profile):
        translate = getattr(rec, "group_map", None) or {}
        self.entry, self.work = entry, {}
        for event in entry.events:
            if event[0] == "work":
                self.work[id(event[1])] = _work_terms(profile, event[1])
        self.collectives = [_collective_terms(op, translate.get(tuple(r), tuple(r)), n, layout)
                            for op, r, n in entry.collectives]

    def hidden(self, cal: time_model.Calibration, chip: str) -> float:
        def work(w):
            return sum(n * max(f / cal.compute_fraction, b / cal.hbm_fraction) for n, f, b in self.work[id(w)])

        def collective(i):
            fixed, steps, kind, transfer, link = self.collectives[i]
            return fixed * cal.collective_s + steps * cal.step_latency_s[kind] + transfer / cal.link(link, chip)

        return time_model.scheduled_hidden(self.entry.events, work, collective) * self.entry.calls


@dataclasses.dataclass
class Sample:
    """A published row and the record its prediction is costed from."""

    key: str
    row: calibration.Row
    record: object  # rank 0's RankRecord (recorder.py), as a plan keeps it
    layout: plans.Layout

    def __post_init__(self):
        self.profile = cost_model.profile_for(self.layout.instance.chip.name, self.layout.lnc)
        self.terms = Terms(self.record, self.layout, self.profile, self.row.step)
        step = self.row.step
        self.graphs = [GraphTerms(e, self.record, self.layout, self.profile)
                       for e in getattr(self.record, "graph_overlaps", None) or [] if e.step == step]
        self.backwards = [b for b in getattr(self.record, "overlaps", None) or [] if b.step == step]

    def step_seconds(self, cal: time_model.Calibration) -> float:
        """The row's step as the plan costs it with ``cal`` (costing.rank_spans), in parts."""
        chip = self.layout.instance.chip.name
        hidden = sum(g.hidden(cal, chip) for g in self.graphs)
        if self.backwards:  # DDP's buckets under the backward (none in the rows' programs)
            spans: dict = {}
            costing.hidden(self.record, spans, self.layout, self.profile, cal, {})
            hidden += spans[self.row.step].hidden_s
        return self.terms.seconds(cal, chip) - hidden

    def predicted(self, cal: time_model.Calibration) -> float:
        """The row's quantity (seconds, or sequences/s) as the plan gives it with ``cal``."""
        count = max(1, self.record.steps[self.row.step].count)
        return calibration.value(self.row, self.step_seconds(cal) / count)

    def ratio(self, cal: time_model.Calibration) -> float:
        return calibration.ratio(self.row, self.predicted(cal))


def layout_of(plan: dict) -> plans.Layout:
    """The layout of a written plan (plan.json's object, schema 2 or 3)."""
    from torch_neuronx import simulate

    old = recorded.read(plan, "a row's plan")
    instance, nnodes, lnc = simulate.resolve(old.instance, old.nnodes, old.nproc_per_node, old.lnc)
    return plans.Layout(instance, lnc, nnodes, old.nproc_per_node)


def rank0(plan: dict):
    """Rank 0's record from a written plan (plan.json's object, schema 2 or 3)."""
    old = recorded.read(plan, "a row's plan")
    return recorded.recorded_record(old, old.ranks[0], recorded.group_ranks_of(old), {})


def samples(records: dict) -> list[Sample]:
    """A Sample of each row whose run is in ``records``: {run: (rank 0's record, layout)}."""
    return [Sample(key, row, *records[row.run]) for key, row in calibration.ROWS.items() if row.run in records]


def with_values(cal: time_model.Calibration, values) -> time_model.Calibration:
    for (_, _, write), value in zip(FITTED, values):
        cal = write(cal, value)
    return cal


def _objective(rows: list[Sample], base: time_model.Calibration):
    def f(logs):
        values = [math.exp(v) for v in logs]
        if any(v > 1.0 for v in values[:FRACTIONS]):
            return 1e9
        cal = with_values(base, values)
        return sum(math.log(s.ratio(cal)) ** 2 for s in rows)
    return f


def _search(f, start: list[float]) -> tuple[list[float], float]:
    """Nelder-Mead from ``start`` (logarithms), then again from where it stopped (a fresh simplex)."""
    point = [math.log(max(v, 1e-9)) for v in start]
    for _ in range(2):
        point, value = minimize.nelder_mead(f, point, step=0.5, iterations=1500, tolerance=1e-10)
    return point, value


def fit(rows: list[Sample], base: time_model.Calibration = time_model.CALIBRATION,
        starts=None) -> time_model.Calibration:
    """The constants minimizing the squared log ratios over ``rows``: the best of searches from
    ``base``'s values and from each of ``starts`` (:data:`STARTS` by default)."""
    f = _objective(rows, base)
    starts = [[read(base) for _, read, _ in FITTED], *map(list, STARTS if starts is None else starts)]
    best, _ = min((_search(f, start) for start in starts), key=lambda found: found[1])
    return with_values(base, [math.exp(v) for v in best])


def leave_one_out(rows: list[Sample], base: time_model.Calibration = time_model.CALIBRATION,
                  starts=None) -> dict[str, float]:
    """Each row's held-out ratio: predicted / AWS's figure with the constants fitted to the others
    (each search starting from the fit to every row, and from ``starts``)."""
    every = fit(rows, base, starts)
    return {s.key: s.ratio(fit([r for r in rows if r is not s], every, starts)) for s in rows}


def rounded(cal: time_model.Calibration, digits: int = 2) -> time_model.Calibration:
    """The fitted constants to ``digits`` significant digits (what CALIBRATION states)."""
    def round_to(v):
        return float(f"{v:.{digits}g}")
    return with_values(cal, [round_to(read(cal)) for _, read, _ in FITTED])


# ---- the suite's rows: 1 and 2 layers (and microbatches), extrapolated ------------------------------
def _linear(parts: dict, layers: int, microbatches: int, get) -> Counter:
    """{key: count} at full depth from {(l, m): record}: a fixed part, one per layer, one per
    microbatch and one per both (every layer and microbatch does the same)."""
    a, b = Counter(get(parts[1, 1])), Counter(get(parts[2, 1]))
    out = Counter()
    if (1, 2) in parts:
        c, d = Counter(get(parts[1, 2])), Counter(get(parts[2, 2]))
        for key in a | b | c | d:
            per_both = d[key] - b[key] - c[key] + a[key]
            out[key] = (a[key] + (layers - 1) * (b[key] - a[key]) + (microbatches - 1) * (c[key] - a[key])
                        + (layers - 1) * (microbatches - 1) * per_both)
    else:
        for key in a | b:
            out[key] = a[key] + (layers - 1) * (b[key] - a[key])
    return +out


def extrapolate(parts: dict, run: calibration.Run):
    """Rank 0's record of ``run`` at full depth from its records at 1 and 2 layers (and 1 and 2
    microbatches for a training run): its work, launches and collectives, step by step."""
    rec = parts[1, 1]
    full = type(rec)(rec.rank)
    full.steps, full.overlaps = rec.steps, []
    steps = set(rec.work) | set(rec.launches)
    full.work = {s: dict(_linear(parts, run.layers, run.microbatches, lambda r: r.work.get(s, {}))) for s in steps}
    full.launches = {s: dict(_linear(parts, run.layers, run.microbatches, lambda r: r.launches.get(s, {})))
                     for s in steps}
    full.grouped = dict(_linear(parts, run.layers, run.microbatches, costing.grouped_collectives))
    full.graph_overlaps = _graph_overlaps(parts, run)
    return full


def _overlap_key(entry) -> tuple:
    return entry.step, entry.graph, repr(entry.collectives), repr(entry.events)


def _graph_overlaps(parts: dict, run: calibration.Run) -> list:
    """The compiled graphs' overlap entries at full depth: each graph's calls extrapolated as the
    work is (a layer's block is one graph, called once per layer and microbatch)."""
    entries = {_overlap_key(e): e for rec in parts.values() for e in rec.graph_overlaps}
    calls = _linear(parts, run.layers, run.microbatches,
                    lambda r: {_overlap_key(e): e.calls for e in r.graph_overlaps})
    return [dataclasses.replace(entries[key], calls=n) for key, n in calls.items()]
