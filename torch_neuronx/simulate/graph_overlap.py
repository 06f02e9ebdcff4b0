"""Collectives inside a compiled graph that run under the graph's independent compute.

In one NEFF, a collective runs on the links while the compute engine goes on with work that does
not need its result, and the compiler orders the work so that it can: an op that feeds no later
collective (a weight gradient, whose result only leaves the graph) can wait for a gap. So tensor
parallelism's all-reduce before the next matmul hides under nothing, and the reduce-scatter of a
backward's input gradient hides under the weight gradients. While a graph's first call runs,
:class:`GraphEvents` keeps its ops (their work and the tensors they read and write) and its
collectives in order; :meth:`GraphEvents.kept` turns them into events the plan schedules
(:func:`torch_neuronx.trainium.time_model.scheduled_hidden`). Tensors are told apart by their
storage (views of a collective's result are its result); only graphs where some work can run while
a collective is in flight are kept.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GraphOverlap:
    """A compiled graph whose collectives can run under its own compute, on one step: its calls there
    (RankRecord.graph_overlaps)."""

    step: str | None
    graph: str
    collectives: list  # (op, ranks, bytes) in call order
    events: list  # GraphEvents.kept()
    calls: int = 0


class GraphEvents:
    """One graph call's ops and collectives, in order."""

    def __init__(self):
        self.nodes: list = []  # ("op", work key, inputs, results) or ("collective", index, inputs, results)
        self.count = 0  # collectives so far
        self.made: dict = {}  # storage key -> the tensor it holds now (a storage freed is reused)

    def _node(self, kind: str, what, input_keys, result_keys) -> None:
        inputs = tuple(self.made.get(k, (k, 0)) for k in input_keys)
        for key in result_keys:
            self.made[key] = (key, len(self.nodes) + 1)
        self.nodes.append((kind, what, inputs, tuple(self.made[k] for k in result_keys)))

    def collective(self, input_keys, result_keys) -> None:
        self._node("collective", self.count, input_keys, result_keys)
        self.count += 1

    def waited_as(self, input_keys, result_keys) -> None:
        """A wait on a collective's result (``wait_tensor``) hands it back as a new tensor: the same result."""
        self._node("wait", None, input_keys, result_keys)

    def op(self, work_key, input_keys, result_keys) -> None:
        self._node("op", work_key, input_keys, result_keys)

    def _feeding(self) -> list[bool]:
        """Whether each node feeds a collective after it (through any chain of ops): the ops the
        compute engine must run in order; the others can fill its gaps."""
        needed, feeding = set(), [False] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            kind, _, inputs, results = self.nodes[i]
            if kind == "collective" or any(r in needed for r in results):
                feeding[i] = True
                needed.update(inputs)
        return feeding

    def kept(self) -> list | None:
        """The events to schedule: ("collective", i), or ("work", {work key: calls}, the collectives
        whose result it reads, whether it can fill a gap); None when no work can run while a
        collective is in flight (nothing to hide it)."""
        if not self.count:
            return None
        feeding, source, events, overlaps = self._feeding(), {}, [], False
        for (kind, what, inputs, results), feeds in zip(self.nodes, feeding):
            if kind == "collective":
                source.update((r, what) for r in results)
                events.append(("collective", what))
                continue
            waits = tuple(sorted({source[k] for k in inputs if k in source}))
            if kind == "wait":
                source.update((r, source[k]) for k in inputs if k in source for r in results)
                continue
            last = events[-1] if events else None
            overlaps = overlaps or not feeds or (last is not None and last[0] == "collective" and not waits)
            if last is not None and last[0] == "work" and not waits and last[3] == (not feeds):
                last[1][what] = last[1].get(what, 0) + 1
            else:
                events.append(("work", {what: 1}, waits, not feeds))
        return events if overlaps else None
