"""Collectives a backward pass launches without waiting for them (DDP's gradient buckets), and the
backward compute that follows each: what DDP overlaps each bucket's all-reduce with.

DDP launches a bucket's all-reduce from the hook that runs once the bucket's last gradient is
accumulated (an ``AccumulateGrad`` post hook) and waits for all of them only when the backward
ends. A collective launched there is taken as overlapping the rest of the backward; one launched
from any other autograd node (tensor parallelism's, whose result the next op needs) or from a
callback at the backward's end (static_graph's first iteration, FSDP2's last reduce-scatter: no
compute is left to hide it) is not. Each backward
with such collectives leaves a record: its step, the collectives' indices in the rank's record (in
launch order), and after each the work and launches that follow it up to the next one, or to the
end of the backward's last autograd node (a segment; DDP waits for its buckets in a callback after
that). The plan costs them (costing.hidden).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

ASYNC_NODES = ("AccumulateGrad",)


def _launched_async() -> bool:
    """Whether the collective being made now is one the backward does not wait for (see above)."""
    node = torch._C._current_autograd_node()
    return node is not None and node.name().endswith(ASYNC_NODES)


@dataclass
class Segment:
    """The work and launches after one launched collective, up to the next one (or the backward's end)."""

    work: dict = field(default_factory=dict)  # (precision, FLOPs, HBM bytes) -> calls
    eager: int = 0
    graph: int = 0


@dataclass
class Backward:
    """A backward that launched collectives it does not wait for: its step, the collectives (indices
    into the rank's record; re-costed, the calls themselves: costing.overlap_calls) and a segment
    after each."""

    step: str | None
    calls: list = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)


class Backwards:
    """Follows one rank's backward passes for :class:`recorder.RankRecorder`."""

    def __init__(self, record, step_of, line_of):
        self.record, self.step_of, self.line_of, self.depth, self.current = record, step_of, line_of, 0, None
        self.line = None  # the program's line that started the backward (its loss.backward())

    def wrap(self, run_backward):
        """``run_backward`` (torch.autograd's engine entry) with this record's begin and end around it."""
        def run(*args, **kwargs):
            self.depth += 1
            if self.depth == 1:
                self.current = Backward(self.step_of())
                self.line = self.line_of()
            try:
                return run_backward(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0 and self.current.calls:
                    self.record.overlaps.append(self.current)
                if self.depth == 0:
                    self.current = None
        return run

    def async_line(self) -> str | None:
        """The backward's line when the collective being made now runs under it (a comm hook's own
        line is not where the program waits for it), else None."""
        return self.line if self.current is not None and _launched_async() else None

    def collective(self, index: int) -> None:
        if self.current is not None and _launched_async():
            self.current.calls.append(index)
            self.current.segments.append(Segment())

    def _after_a_launch(self) -> bool:
        """Whether work now runs after a launched collective and can hide it: inside an autograd node.
        The backward's callbacks at its end come after DDP's wait (its finalize copies the results
        back into the gradients)."""
        return bool(self.current is not None and self.current.segments
                    and torch._C._current_autograd_node() is not None)

    def work(self, key, n: int = 1) -> None:
        if self._after_a_launch():
            segment = self.current.segments[-1].work
            segment[key] = segment.get(key, 0) + n

    def launch(self, kind: str, n: int) -> None:
        """``n`` launches of ``kind`` ("eager" or "graph")."""
        if self._after_a_launch():
            segment = self.current.segments[-1]
            if kind == "eager":
                segment.eager += n
            else:
                segment.graph += n
