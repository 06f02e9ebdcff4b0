"""The readiness report's rows, typed: what report.json holds of each finding, footnote, phase,
op family, signature, compiled graph and memory peak, and its verdict. Each row's ``to_dict`` is
its JSON object, keys in field order (:class:`torch_neuronx.runtime.rows.Row`); ``from_dict`` reads
one back where a written report is read (a baseline)."""
from __future__ import annotations

from dataclasses import dataclass

from torch_neuronx.runtime.rows import Row, rows_of


@dataclass
class SignatureRow(Row):
    op: str
    inputs: list[str]
    family: str
    calls: int
    flops: int
    bytes: int
    estimated_us: float  # per call


@dataclass
class FamilyRow(Row):
    family: str
    calls: int
    flops: int
    bytes: int
    estimated_ms: float
    bound: str


@dataclass
class PhaseRow(Row):
    name: str
    wall_s: float
    eager_calls: int
    compiled_graph_calls: int
    estimated_ms: float  # the roofline time
    launches: int  # NEFF launches (eager op launches and compiled graph calls)
    steady_state_ms: float  # the roofline time plus the launches
    families: list[FamilyRow]

    nested = {"families": rows_of(FamilyRow)}


@dataclass
class MemoryRow(Row):
    device: str
    peak_bytes: int
    emulated_capacity_bytes: int


@dataclass(frozen=True)
class FindingRow(Row):
    """One source line (or device) and kind: the findings made there merged (places.rows)."""

    severity: str  # a key of findings.SEVERITIES
    kind: str  # a key of findings.KINDS
    site: str  # file:line, or where there is no line (a device, "<unknown>")
    file: str | None
    line: int | None
    code: str  # the source line, stripped ('' when it cannot be read)
    context: list[str]  # where the calls ran when it is not plain code: "backward (MulBackward0)", ...
    ops: dict[str, int]  # op -> calls
    count: int
    details: list[str]
    meaning: str  # what happens on Trainium
    fix: str
    sources: list[int]  # the footnotes (SourceRow.id) it cites
    path: str | None  # the file as another machine names it (places.relative_path)
    in_repository: bool  # whether the file is the project's own
    fingerprint: str  # what baselines match (places.fingerprint)


@dataclass(frozen=True)
class SourceRow(Row):
    """A footnote the findings cite: the source behind the unsupported-op table."""

    id: int
    name: str
    url: str


@dataclass(frozen=True)
class CompiledGraphRow(Row):
    name: str
    ops: int
    calls: int
    estimated_ms_per_call: float
    error: str
    lowering: str  # "lowered", "failed", "not lowered" or "not checked: why"
    parts: dict[str, str]  # forward/backward/inference -> "lowered" or "failed: op (stage)"
    lowering_s: float
    stablehlo_ops: dict[str, int]  # StableHLO ops by kind


@dataclass(frozen=True)
class Verdict(Row):
    """The report's first line and what it rests on."""

    status: str  # "ready", "ready with changes", "not ready" or "not checked"
    places: dict[str, int]  # severity -> places
    estimated_ms: float
    neffs: int
    first_run_seconds: list[float]
    steady_state_seconds: float
    steady_state_interval_seconds: list[float]
    text: str
