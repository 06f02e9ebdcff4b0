"""A plan's rows, typed: what plan.json holds of each rank, step, collective, process group, rank
over its HBM and backward, and of the job's time, communication, divergence and simulation. Each
row's ``to_dict`` is its JSON object, keys in field order, an optional key left out while None
(:class:`torch_neuronx.runtime.rows.Row`); :mod:`.recorded` reads a written plan back."""
from __future__ import annotations

from dataclasses import dataclass

from torch_neuronx.runtime.rows import Row, map_of, rows_of


@dataclass(frozen=True)
class CollectiveRow(Row):
    """One distinct collective call of a rank (costing.costed_collectives), with its calls."""

    op: str
    group: str | None  # the group's name (GroupRow.name)
    bytes: int
    shapes: str
    line: str | None
    step: str | None
    calls: int
    seconds: float  # one call's


@dataclass(frozen=True)
class StepRow(Row):
    """A marked step's time (plan._step_rows): per step, the mean over its calls; per token or
    sequence when the step counts them."""

    count: int
    tokens: int | None
    sequences: int | None
    seconds: float
    interval_seconds: list[float]
    bounds_seconds: list[float]
    compute_seconds: float
    launch_seconds: float
    eager_launches: float
    graph_launches: float
    communication_seconds: float
    communication_latency_seconds: float
    communication_fixed_seconds: float
    communication_hidden_seconds: float
    collective_calls: float
    per_token_seconds: float | None = None
    per_token_interval_seconds: list[float] | None = None
    tokens_per_second: float | None = None
    tokens_per_second_interval: list[float] | None = None
    per_sequence_seconds: float | None = None
    per_sequence_interval_seconds: list[float] | None = None
    sequences_per_second: float | None = None
    sequences_per_second_interval: list[float] | None = None

    optional = ("per_token_seconds", "per_token_interval_seconds", "tokens_per_second", "tokens_per_second_interval",
                "per_sequence_seconds", "per_sequence_interval_seconds", "sequences_per_second",
                "sequences_per_second_interval")


@dataclass(frozen=True)
class Crossing(Row):
    """Where a rank's memory crossed its core's HBM (unknown, all None but the live bytes, when a plan
    was re-costed for a smaller HBM)."""

    line: str | None
    site: str | None
    op: str | None
    allocation_bytes: int | None
    live_bytes: int


@dataclass(frozen=True)
class RankError(Row):
    message: str
    line: str | None


@dataclass(frozen=True)
class RankRow(Row):
    """One rank's row of the plan: where it runs, its memory, its time and its collectives."""

    rank: int
    node: int
    local_rank: int
    chip: int
    peak_bytes: int
    capacity_bytes: int
    fits: bool
    allocations: int
    step_seconds: float
    step_interval_seconds: list[float]
    step_bounds_seconds: list[float]
    compute_seconds: float
    launch_seconds: float
    eager_launches: float
    graph_launches: float
    communication_seconds: float
    communication_latency_seconds: float
    communication_fixed_seconds: float
    communication_hidden_seconds: float
    collective_calls: int
    collectives: list[CollectiveRow]
    steps: dict[str, StepRow]
    over_capacity: Crossing | None = None
    error: RankError | None = None
    relabelled_from: int | None = None  # not run: that rank's record, groups translated

    optional = ("over_capacity", "error", "relabelled_from")
    nested = {"collectives": rows_of(CollectiveRow), "steps": map_of(StepRow), "over_capacity": Crossing.from_dict,
              "error": RankError.from_dict}


@dataclass(frozen=True)
class OverCapacityRow(Row):
    """A rank over its core's HBM, and where it crossed (the plan's ``over_capacity``)."""

    rank: int
    peak_bytes: int
    line: str | None
    site: str | None
    op: str | None
    allocation_bytes: int | None
    live_bytes: int


@dataclass(frozen=True)
class GroupRow(Row):
    """A process group, named g0, g1, ... in the order first seen, and the link it crosses."""

    name: str
    ranks: str  # id_ranges of its global ranks, in its own order
    size: int
    link: str
    bytes_per_s_per_rank: float


@dataclass(frozen=True)
class OverlapCallRow(Row):
    """A collective a backward launched without waiting for it (DDP's bucket)."""

    op: str
    ranks: str
    bytes: int
    line: str | None
    seconds: float
    compute_after_seconds: float


@dataclass(frozen=True)
class BackwardRow(Row):
    """A backward's collectives that run under its compute, and the time they hide (costing.hidden)."""

    step: str | None
    hidden_seconds: float
    exposed_seconds: float
    calls: list[OverlapCallRow]

    nested = {"calls": rows_of(OverlapCallRow)}


@dataclass(frozen=True)
class PlanTime(Row):
    """The job's time: the slowest rank's, with what the estimate rests on."""

    step_seconds: float
    interval_seconds: list[float]
    bounds_seconds: list[float]
    slowest_rank: int
    steps: dict[str, StepRow]
    profile: dict  # cost_model.TrainiumProfile.as_dict()
    calibration: dict  # time_model.Calibration.as_dict()
    assumptions: list[str]
    sources: list[str]
    backward_overlap: list[BackwardRow]  # rank 0's

    nested = {"steps": map_of(StepRow), "backward_overlap": rows_of(BackwardRow)}


@dataclass(frozen=True)
class Communication(Row):
    slowest_rank: int | None
    seconds: float
    sources: list[str]
    assumptions: list[str]


@dataclass(frozen=True)
class Divergence(Row):
    """The first disagreement between the members of a process group (plan.check_divergence)."""

    rank: int
    ranks: list[int]
    group: list[int]
    index_in_group: int
    index_in_rank: int | None
    line: str | None
    call: str
    others: str
    message: str


@dataclass(frozen=True)
class Symmetry(Row):
    """Whether the ranks that did not run are rank 0's relabelled, and why not when every rank ran."""

    used: bool
    jobs: int
    why_every_rank_ran: str | None
    rank0_rank_uses: list[str]


@dataclass(frozen=True)
class Simulation(Row):
    """How the plan was had: the engine's runs, and for a re-costed plan what it was re-costed from."""

    elapsed_seconds: float
    script_runs: int
    symmetry: Symmetry
    recosted_from: str | None = None
    recorded_on: str | None = None
    recorded_schema: int | None = None

    optional = ("recosted_from", "recorded_on", "recorded_schema")
    nested = {"symmetry": Symmetry.from_dict}


@dataclass(frozen=True)
class OutputRow(Row):
    """One output of a numerics plan: every rank's value against one device's."""

    shape: list[int]
    dtype: str
    max_abs_difference: float
    worst_rank: int
    ok: bool
    values: list | None = None  # each rank's, for a small output (a loss curve, say)
    one_device: list | float | None = None

    optional = ("values", "one_device")


@dataclass(frozen=True)
class Numerics(Row):
    """A numerics plan's comparison: each output's, and whether all agree."""

    ok: bool
    outputs: dict[str, OutputRow]
    missing: list[str]
    layout: str
    tolerance: str
    elapsed_seconds: float

    nested = {"outputs": map_of(OutputRow)}
