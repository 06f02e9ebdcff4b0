"""What a plan keeps to be re-costed (``recorded``: each run rank's op calls' work, launches, steps
and backwards, :func:`record_json`), and reading it back from a written plan: a rank's record again
(:func:`recorded_record`), for :func:`.plan.recost` and the fit of the time model (:mod:`.fit`)."""
from __future__ import annotations

from dataclasses import dataclass

from torch_neuronx.runtime.rows import Row, rows_of
from torch_neuronx.simulate import costing
from torch_neuronx.simulate.graph_overlap import GraphOverlap
from torch_neuronx.simulate.rows import CollectiveRow, Crossing, Divergence, GroupRow, RankError, Simulation
from torch_neuronx.simulate.steps import StepCount

# The plan schemas --recost reads: what it re-costs was recorded alike in both.
RECOSTABLE = (2, 3)


@dataclass(frozen=True)
class RecordedRank(Row):
    """What re-costing reads of a written plan's rank (its RankRow, of schema 2 or 3)."""

    rank: int
    peak_bytes: int
    allocations: int
    collectives: list[CollectiveRow]
    over_capacity: Crossing | None = None
    error: RankError | None = None
    relabelled_from: int | None = None

    nested = {"collectives": rows_of(CollectiveRow), "over_capacity": Crossing.from_dict,
              "error": RankError.from_dict}


@dataclass(frozen=True)
class RecordedPlan(Row):
    """What re-costing and the fit read of a written plan (schema 2 or 3): its layout, its ranks, groups,
    divergence and simulation, and each run rank's recorded work (``recorded``: record_json's)."""

    schema: int
    script: str
    args: list
    instance: str
    lnc: int
    nnodes: int
    nproc_per_node: int
    ranks: list[RecordedRank]
    groups: list[GroupRow]
    divergence: Divergence | None
    simulation: Simulation
    recorded: dict
    chip: str | None = None

    nested = {"ranks": rows_of(RecordedRank), "groups": rows_of(GroupRow), "divergence": Divergence.from_dict,
              "simulation": Simulation.from_dict}


def read(data, source: str) -> RecordedPlan:
    """A written plan (plan.json's object) as re-costing reads it; ValueError, naming the fix, when it
    is not a plan this version can re-cost, KeyError when a key it needs is missing."""
    check_recostable(data, source)
    return RecordedPlan.from_dict(data)


def script_named(data):
    """The script a written plan names (for an error message: the plan is not read yet)."""
    return data.get("script")


def record_json(rec) -> dict:
    """What re-costing a run rank needs beyond its entry: its op calls' work, launches and steps."""
    def steps_of(table):
        return [{"step": step, "items": items} for step, items in table.items()]

    overlaps = [{"step": b.step, "calls": [list(call) for call in costing.overlap_calls(rec, b)],
                 "segments": [{"work": [[p, f, n_bytes, n] for (p, f, n_bytes), n in seg.work.items()],
                               "eager": seg.eager, "graph": seg.graph} for seg in b.segments]}
                for b in getattr(rec, "overlaps", None) or []]
    return {"work": steps_of({s: [[p, f, b, n] for (p, f, b), n in w.items()] for s, w in rec.work.items()}),
            "launches": steps_of(rec.launches), "steps": {name: s.to_dict() for name, s in rec.steps.items()},
            "overlaps": overlaps,
            "graph_overlaps": [_graph_overlap_json(entry) for entry in getattr(rec, "graph_overlaps", None) or []]}


def _graph_overlap_json(entry: GraphOverlap) -> dict:
    events = [list(e) if e[0] == "collective" else ["work", [[*k, n] for k, n in e[1].items()], list(e[2]), e[3]]
              for e in entry.events]
    return {"step": entry.step, "graph": entry.graph,
            "collectives": [[op, list(ranks), nbytes] for op, ranks, nbytes in entry.collectives], "events": events,
            "calls": entry.calls}


# ---- reading back: record_json's keys are read here only ------------------------------------------
def _graph_overlaps_of(recorded: dict) -> list[GraphOverlap]:
    """record_json's graph_overlaps back as a record holds them (schema 2 plans have none)."""
    out = []
    for entry in recorded.get("graph_overlaps", []):
        events = [tuple(e) if e[0] == "collective" else
                  ("work", {tuple(i[:3]): i[3] for i in e[1]}, tuple(e[2]), e[3]) for e in entry["events"]]
        out.append(GraphOverlap(entry["step"], entry["graph"],
                                [(op, tuple(ranks), nbytes) for op, ranks, nbytes in entry["collectives"]], events,
                                entry["calls"]))
    return out


def _overlaps_of(recorded: dict) -> list:
    """record_json's overlaps back as a record holds them (its calls resolved, not indices)."""
    from torch_neuronx.simulate.overlap import Backward, Segment

    return [Backward(b["step"], [(op, tuple(ranks), n_bytes, line) for op, ranks, n_bytes, line in b["calls"]],
                     [Segment({tuple(item[:3]): item[3] for item in seg["work"]}, seg["eager"], seg["graph"])
                      for seg in b["segments"]])
            for b in recorded.get("overlaps", [])]


def _recorded_parts(recorded: dict) -> tuple:
    """A run rank's record_json back as its record holds it: (work, launches, steps, backwards,
    compiled graphs' overlaps)."""
    return ({s["step"]: {tuple(item[:3]): item[3] for item in s["items"]} for s in recorded["work"]},
            {s["step"]: s["items"] for s in recorded["launches"]},
            {name: StepCount.from_dict(s) for name, s in recorded["steps"].items()}, _overlaps_of(recorded),
            _graph_overlaps_of(recorded))


def recorded_record(old: RecordedPlan, entry: RecordedRank, group_ranks: dict, base: dict):
    """A rank's record again from a written plan (``entry`` one of its ranks, ``group_ranks`` its
    groups' ranks by name): its recorded work, launches, steps and backwards (shared through ``base``
    with the ranks relabelled from the same run), and its collectives as the plan grouped them."""
    from torch_neuronx.simulate.recorder import OverCapacity, RankRecord

    rec = RankRecord(entry.rank, entry.peak_bytes, allocations=entry.allocations)
    source_rank = str(entry.rank if entry.relabelled_from is None else entry.relabelled_from)
    if source_rank not in base:
        base[source_rank] = _recorded_parts(old.recorded[source_rank])
    rec.work, rec.launches, rec.steps, rec.overlaps, rec.graph_overlaps = base[source_rank]
    rec.grouped = {(c.op, group_ranks[c.group], c.bytes, c.shapes, c.line, c.step): c.calls for c in entry.collectives}
    rec.relabelled_from = entry.relabelled_from
    if entry.error is not None:
        rec.error, rec.error_line = entry.error.message, entry.error.line
    over = entry.over_capacity
    if over is not None and over.allocation_bytes:
        rec.over = OverCapacity(over.live_bytes, over.allocation_bytes, over.op, over.line, over.site)
    return rec


def group_ranks_of(old: RecordedPlan) -> dict:
    """{group name: its global ranks} of a written plan."""
    return {g.name: _parse_ranges(g.ranks) for g in old.groups}


def check_recostable(old, source: str) -> None:
    """Raise ValueError, naming the fix, unless ``old`` (a plan.json's object) is a plan re-costing can
    read: the check before :func:`read` reads it."""
    if not isinstance(old, dict) or old.get("schema") not in RECOSTABLE or old.get("mode") != "structure" \
            or "recorded" not in old:
        described = (f"schema {old.get('schema')!r}, mode {old.get('mode')!r}" if isinstance(old, dict)
                     else type(old).__name__)
        known = " or ".join(map(str, RECOSTABLE))
        raise ValueError(f"{source} is not a plan this version can re-cost ({described}; re-costing needs a "
                         f"structure plan of schema {known}, which keeps its recorded work): run the simulation "
                         "again to write one")


def _parse_ranges(text: str) -> tuple[int, ...]:
    """'0-3,6' -> (0, 1, 2, 3, 6): the inverse of id_ranges, in the group's own order."""
    out = []
    for part in text.split(","):
        if part in ("-", ""):
            continue
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return tuple(out)
