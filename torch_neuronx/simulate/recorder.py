"""What one simulated rank does, seen from the dispatcher: the bytes of neuron storages it keeps
alive (current and peak), the allocation that first went over its core's HBM, and its collectives
in order. One :class:`RankRecorder` per rank, pushed as a TorchDispatchMode inside FakeTensorMode.

Storage lifetimes are followed as torch's own ``MemTracker`` does (torch.distributed._tools): a
weak reference to each new ``UntypedStorage``, whose callback subtracts its bytes when the last
tensor viewing it dies; ``UntypedStorage.resize_`` (which FSDP2 uses to free and re-allocate the
unsharded parameters) does not pass the dispatcher, so it is wrapped while a recorder is active.
"""
from __future__ import annotations

import contextlib
import functools
import os
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torch_neuronx.trainium import time_model
from torch_neuronx.trainium.cost_model import TensorMeta
from torch_neuronx.runtime import BACKEND_NAME, frames
from torch_neuronx.simulate import compiled, graph_overlap, overlap, replay, steps


# c10d ops (dist.* calls) and functional collectives (DTensor, FSDP2's reduce-scatter, compiled
# graphs), by the name the plan gives them. The first tensor argument is the one that travels.
COLLECTIVES = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced",
    "allgather_": "all_gather", "_allgather_base_": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced", "allgather_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced", "broadcast_": "broadcast",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single", "barrier": "barrier", "monitored_barrier_": "barrier",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    # _c10d_functional
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather_into_tensor": "all_gather_into_tensor", "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single", "broadcast": "broadcast",
}


def user_frames(script: str, limit: int = 0):
    """(innermost line of the user's script, innermost line outside torch, torch_neuronx and the
    standard library), each 'file:line' or None. Frame walking, not traceback: it is called on
    every collective."""
    in_script = outside = None
    for frame in frames.outward():
        name = frame.f_code.co_filename
        if name == script:
            in_script = f"{os.path.basename(name)}:{frame.f_lineno}"
            break
        if outside is None and not frames.is_library(name, stdlib=True, pseudo=True):
            outside = f"{name}:{frame.f_lineno}"
    return in_script, outside


def _is_boxed_group(value) -> bool:
    return isinstance(value, torch.ScriptObject) and "ProcessGroup" in value._type().qualified_name()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def group_ranks(group) -> tuple[int, ...]:
    """The global ranks of a process group given as a ProcessGroup or by its name."""
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    try:
        return tuple(dist.get_process_group_ranks(group))
    except (ValueError, RuntimeError, KeyError):
        pass
    # The C++ object of a group the Python side knows under its name (DeviceMesh's scatter).
    try:
        named = dist.distributed_c10d._resolve_process_group(group.group_name)
        return tuple(dist.get_process_group_ranks(named))
    except (ValueError, RuntimeError, AttributeError):
        return ()


@dataclass
class Collective:
    op: str
    ranks: tuple[int, ...]  # the group's global ranks
    bytes: int  # the largest buffer of the call (all_gather: its output; reduce_scatter: its input)
    shapes: str  # e.g. "float32[1024]"
    line: str | None  # the user's script line that led to it
    step: str | None = None  # the marked step it ran in (steps.step), None outside any

    def signature(self) -> tuple:
        """What every member of the group must agree on."""
        return (self.op, self.bytes, self.shapes)


@dataclass
class OverCapacity:
    bytes_live: int  # bytes live once the allocation was made
    allocation: int  # bytes of the allocation that crossed
    op: str
    line: str | None
    site: str | None  # innermost frame outside torch, when it is not the script's


@dataclass
class RankRecord:
    rank: int
    peak_bytes: int = 0
    current_bytes: int = 0
    allocations: int = 0
    collectives: list[Collective] = field(default_factory=list)
    over: OverCapacity | None = None
    error: str | None = None
    error_line: str | None = None
    rank_uses: list[str] = field(default_factory=list)  # the program's uses of its rank (symmetry.py)
    rank_use_count: int = 0
    relabelled_from: int | None = None  # not run: rank 0's record relabelled (symmetry.py)
    # The compute of the rank's op calls, by marked step (None: outside any): {(precision, FLOPs, HBM
    # bytes): calls}, and the NEFF launches ("eager", "graph"); costed by the plan (time_model).
    work: dict = field(default_factory=dict)
    launches: dict = field(default_factory=dict)
    steps: dict[str, steps.StepCount] = field(default_factory=dict)  # by name
    # Backwards that launched collectives they do not wait for (DDP's buckets), with the work after each.
    overlaps: list[overlap.Backward] = field(default_factory=list)
    # Compiled graphs whose collectives can run under their own independent compute.
    graph_overlaps: list[graph_overlap.GraphOverlap] = field(default_factory=list)
    group_map: dict | None = None  # relabelled lightly: rank 0's groups -> this rank's (symmetry.py)
    grouped: dict | None = None  # re-costed: the collectives as costing.grouped_collectives gives them


class GraphCall:
    """One call of a compiled graph being costed as one fused NEFF, and what it did (to replay it)."""

    def __init__(self, name: str, account: time_model.FusedAccount, record: RankRecord):
        self.name, self.account, self.outputs = name, account, None
        self.work: Counter = Counter()
        self.events = graph_overlap.GraphEvents()
        self.kept_events = None  # events.kept() once the call ends
        self.first_collective, self.start_bytes = len(record.collectives), record.current_bytes
        self.start_allocations, self.high_water = record.allocations, 0
        self.replayable = True  # not when a graph call ran inside it (its work is not in self.work)

    def recording(self, record: RankRecord, args) -> replay.GraphRecording | None:
        """This call's record for replay.py, or None when it cannot be replayed."""
        layouts = replay.output_layouts(args, self.outputs) if self.outputs is not None else None
        if not self.replayable or layouts is None:
            return None
        collectives = [(c.op, c.ranks, c.bytes, c.shapes) for c in record.collectives[self.first_collective:]]
        allocations = record.allocations - self.start_allocations - replay.new_outputs(layouts)
        return replay.GraphRecording(self.name, Counter(self.work), collectives, self.high_water, allocations,
                                     layouts, type(self.outputs), self.kept_events)


@functools.lru_cache(maxsize=4096)
def _op_name(func) -> str:
    return func._schema.name + ("" if func._overloadname == "default" else f".{func._overloadname}")


def _keyed_metas(tree) -> list[tuple[int, TensorMeta]]:
    """(storage key, meta) of every neuron tensor in ``tree``."""
    flat, _ = tree_flatten(tree)
    return time_model.keyed_metas(t for t in flat if isinstance(t, torch.Tensor) and t.device.type == BACKEND_NAME)


class RankRecorder(TorchDispatchMode):
    """Counts neuron storages and records collectives for one rank."""

    def __init__(self, rank: int, capacity: int, script: str):
        super().__init__()
        self.record = RankRecord(rank)
        self.capacity = capacity
        self.script = script
        self._last: dict[int, int] = {}  # id(UntypedStorage) -> its bytes, while it lives
        self._refs: dict[int, weakref.ref] = {}
        self._resize = None
        self._paused = 0
        self._meta = None
        self._step: str | None = None
        self._graph: GraphCall | None = None
        self._high = 0  # the live total's high-water mark inside the current graph call
        self._overlap_entries: dict = {}  # a graph's overlap entry (record.graph_overlaps) by step, graph, calls
        self._overlap_by_events: dict = {}  # (id of a call's events, step) -> (the events, its entry)
        self._replaying = False  # rebuilding a replayed graph's outputs: memory, not compute
        self._backwards = overlap.Backwards(self.record, lambda: self._step,
                                            lambda: (lambda line, site: line or site)(*user_frames(self.script)))
        self._engine = None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Dynamo compiles under this mode (it would skip every frame otherwise); the compiled
        # graphs' ops pass through it again when they run (simulate/compiled.py).
        return True

    # ------------------------------------------------------------ steps and compute

    def begin_step(self, name: str, tokens: int | None, sequences: int | None) -> None:
        if self._step is not None:
            raise RuntimeError(f"torch_neuronx.simulate.step({name!r}) inside step {self._step!r}: steps do not "
                               "nest; end the outer step first, or mark only the innermost one")
        if self._graph is not None:
            raise RuntimeError(f"torch_neuronx.simulate.step({name!r}) inside a compiled graph: mark steps "
                               "outside the compiled function")
        entry = self.record.steps.setdefault(name, steps.StepCount(0, tokens, sequences))
        if (entry.tokens, entry.sequences) != (tokens, sequences):
            raise ValueError(f"torch_neuronx.simulate.step({name!r}) counts tokens={tokens}, sequences={sequences}, "
                             f"where an earlier step of that name counted tokens={entry.tokens}, sequences="
                             f"{entry.sequences}: give steps that process different amounts different names")
        entry.count += 1
        self._step = name

    def end_step(self) -> None:
        self._step = None

    @contextlib.contextmanager
    def graph_call(self, name: str, args):
        """The ops run inside are one call of compiled graph ``name``: one launch, fused."""
        account = time_model.FusedAccount()
        for key, meta in _keyed_metas(args):
            account.add_input(key, meta.nbytes)
        call, outer, outer_high = GraphCall(name, account, self.record), self._graph, self._high
        self._graph, self._high = call, self.record.current_bytes
        try:
            yield call
        finally:
            self._graph = outer
            call.high_water = self._high - call.start_bytes
            self._high = max(outer_high, self._high)
            if outer is not None:
                outer.replayable = False
        self._count_launch("graph")
        if call.outputs is not None:
            key = ("fp32", 0, account.finish(_keyed_metas(call.outputs)))
            self._add_work(key)
            call.work[key] += 1
        call.kept_events = call.events.kept()
        collectives = [(c.op, c.ranks, c.bytes) for c in self.record.collectives[call.first_collective:]]
        self._graph_overlap(name, collectives, call.kept_events)

    def _graph_overlap(self, name: str, collectives: list, events: list | None) -> None:
        """One more call of a graph whose collectives can run under its own compute, on this step."""
        if events is None:
            return
        # A replayed call passes its recording's own events: found by identity, without hashing its
        # collectives' ranks (a rank's ints note each use: slow) or printing its events again.
        same = self._overlap_by_events.get((id(events), self._step))
        if same is None or same[0] is not events:
            key = (self._step, name, tuple(collectives), repr(events))
            entry = self._overlap_entries.get(key)
            if entry is None:
                entry = self._overlap_entries[key] = graph_overlap.GraphOverlap(self._step, name, collectives, events)
                self.record.graph_overlaps.append(entry)
            same = self._overlap_by_events[id(events), self._step] = (events, entry)
        same[1].calls += 1

    def replay_graph(self, recording: replay.GraphRecording, args):
        """A call of a compiled graph alike its recorded first call (replay.py): its collectives, work,
        launch and memory again, without running its ops; its outputs rebuilt."""
        line, site = user_frames(self.script)
        line = self._backwards.async_line() or line or site
        for op, ranks, nbytes, shapes in recording.collectives:
            self.record.collectives.append(Collective(op, ranks, nbytes, shapes, line, self._step))
            self._backwards.collective(len(self.record.collectives) - 1)
        for key, n in recording.work.items():
            self._add_work(key, n)
        self._count_launch("graph")
        self._graph_overlap(recording.name, [c[:3] for c in recording.collectives], recording.events)
        self._reach(recording.high_water, f"compiled graph {recording.name}")
        self.record.allocations += recording.allocations
        self._replaying = True
        try:
            return replay.rebuild(recording.outputs, args, recording.output_type)
        finally:
            self._replaying = False

    def _count_launch(self, kind: str, n: int = 1) -> None:
        if n:
            launches = self.record.launches.setdefault(self._step, {"eager": 0, "graph": 0})
            launches[kind] += n
            self._backwards.launch(kind, n)

    def _add_work(self, key, n: int = 1) -> None:
        work = self.record.work.setdefault(self._step, {})
        work[key] = work.get(key, 0) + n
        self._backwards.work(key, n)

    def _compute(self, func, args, kwargs, out) -> None:
        if func.is_view or func.namespace == "prim" or func is torch.ops.aten._unsafe_view.default:
            return  # no data moves (the report skips them too)
        arguments = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if any(t.device.type != BACKEND_NAME for t in arguments):
            return  # a host transfer (or the program's host-side work): the host link, not HBM, as in the report
        inputs, results = time_model.keyed_metas(arguments), _keyed_metas(out)
        if not inputs and not results:
            return  # no neuron tensor: the program's host-side work
        op = _op_name(func)
        if op == "aten::_local_scalar_dense":
            return  # .item(): a host transfer
        if self._graph is not None:
            key = self._graph.account.op(op, inputs, results)
            self._add_work(key)
            self._graph.work[key] += 1
            self._graph.events.op(key, [k for k, _ in inputs], [k for k, _ in results])
            return
        metas_in, metas_out = tuple(m for _, m in inputs), tuple(m for _, m in results)
        self._add_work(time_model.op_work(op, metas_in, metas_out))
        self._count_launch("eager", time_model.eager_launches(op, metas_in))

    # ------------------------------------------------------------ memory

    def _add(self, nbytes: int, op: str) -> None:
        rec = self.record
        rec.current_bytes += nbytes
        if rec.current_bytes > self._high:
            self._high = rec.current_bytes
        if rec.current_bytes > rec.peak_bytes:
            rec.peak_bytes = rec.current_bytes
            if rec.over is None and rec.current_bytes > self.capacity:
                line, site = user_frames(self.script)
                rec.over = OverCapacity(rec.current_bytes, nbytes, op, line, site)

    def _reach(self, nbytes: int, what: str) -> None:
        """The live total rises ``nbytes`` and falls back (a replayed graph's intermediates)."""
        rec = self.record
        live = rec.current_bytes + nbytes
        if live > rec.peak_bytes:
            rec.peak_bytes = live
            if rec.over is None and live > self.capacity:
                line, site = user_frames(self.script)
                rec.over = OverCapacity(live, nbytes, what, line, site)

    def _track(self, tensor: torch.Tensor, op: str) -> None:
        if tensor.device.type != BACKEND_NAME or self._paused:
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._last:
            return
        nbytes = storage.nbytes()
        record, last, refs = self.record, self._last, self._refs

        def freed(_ref, key=key):
            # The storage's bytes (as last resized) leave the rank's live total.
            record.current_bytes -= last.pop(key, 0)
            refs.pop(key, None)

        last[key] = nbytes
        refs[key] = weakref.ref(storage, freed)
        record.allocations += 1
        self._add(nbytes, op)

    def _resized(self, storage, new_bytes: int) -> None:
        key = id(storage)
        if key in self._last:
            old = self._last[key]
            self._last[key] = new_bytes
            if new_bytes > old:
                self._add(new_bytes - old, "UntypedStorage.resize_")
            else:
                self.record.current_bytes -= old - new_bytes

    def __enter__(self):
        original = torch.UntypedStorage.resize_
        recorder = self

        def resize_(storage, size):
            result = original(storage, size)
            recorder._resized(storage, storage.nbytes())
            return result

        self._resize = original
        torch.UntypedStorage.resize_ = resize_
        # DTensor derives an op's global output shape by running it on global-shape fake tensors
        # under the current fake mode (ours): shape propagation, not the rank's memory.
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        meta = self._meta = ShardingPropagator._propagate_tensor_meta_non_cached

        def propagate(*args, **kwargs):
            recorder._paused += 1
            try:
                return meta(*args, **kwargs)
            finally:
                recorder._paused -= 1

        ShardingPropagator._propagate_tensor_meta_non_cached = propagate
        # torch.autograd imported the engine's entry by name: both references are its callers'.
        self._engine = torch.autograd.graph._engine_run_backward
        torch.autograd.graph._engine_run_backward = torch.autograd._engine_run_backward = \
            self._backwards.wrap(self._engine)
        steps.recording = self
        self._simulating = compiled.installed()
        self._simulating.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        torch.UntypedStorage.resize_ = self._resize
        ShardingPropagator._propagate_tensor_meta_non_cached = self._meta
        torch.autograd.graph._engine_run_backward = torch.autograd._engine_run_backward = self._engine
        steps.recording = None
        self._simulating.__exit__(*exc)
        return super().__exit__(*exc)

    # ------------------------------------------------------------ collectives

    def _collective(self, func, args, kwargs) -> bool:
        """Record a collective call; whether it was one (not a wait or another c10d op)."""
        name = func._schema.name.split("::", 1)[1]
        op = COLLECTIVES.get(name)
        if op is None:
            return False
        flat, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        # c10d ops get the group as a ScriptObject; unbox it to the ProcessGroup the Python side knows.
        groups = [dist.ProcessGroup.unbox(a) if isinstance(a, torch.ScriptObject) else a for a in flat
                  if isinstance(a, dist.ProcessGroup) or _is_boxed_group(a)]
        if not groups and func.namespace == "_c10d_functional":
            groups = [a for a in flat if isinstance(a, str)][-1:]
        ranks = group_ranks(groups[0]) if groups else ()
        # all_gather's payload is its output; the functional form has none, so scale its input.
        size = _nbytes(tensors[:1]) if op not in ("all_gather", "all_gather_into_tensor") else _nbytes(tensors)
        if func.namespace == "_c10d_functional" and op.startswith("all_gather"):
            size = _nbytes(tensors) * max(1, len(ranks))
        elif op.startswith("reduce_scatter") or op.startswith("all_to_all"):
            size = max(_nbytes(tensors[:1]), _nbytes(tensors[1:2]))
        # What this rank contributes, which every member must agree on: for a gather its input (only
        # the root has outputs), for a scatter its output (only the root has inputs), else the first.
        own = tensors[-1:] if op == "gather" else tensors[:1]
        shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}[{', '.join(map(str, t.shape))}]" for t in own)
        if op in ("gather", "scatter"):
            size = _nbytes(own) * max(1, len(ranks))
        line, site = user_frames(self.script)
        line = self._backwards.async_line() or line or site
        self.record.collectives.append(Collective(op, ranks, size, shapes, line, self._step))
        self._backwards.collective(len(self.record.collectives) - 1)
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "prim":
            return func(*args, **kwargs)  # a tensor's device or layout (Dynamo's guards ask every call)
        # Let DTensor turn itself into local ops first: those are what occupy memory.
        if any(issubclass(t, torch.distributed.tensor.DTensor) for t in types):
            return NotImplemented
        collective = func.namespace in ("c10d", "_c10d_functional")
        made = collective and self._collective(func, args, kwargs)
        out = func(*args, **kwargs)
        if collective and self._graph is not None:
            inputs, results = ([k for k, _ in _keyed_metas(tree)] for tree in (args, out))
            if made:
                self._graph.events.collective(inputs, results)
            elif func is torch.ops._c10d_functional.wait_tensor.default:
                self._graph.events.waited_as(inputs, results)
        if not collective and not self._paused and not self._replaying:
            self._compute(func, args, kwargs, out)
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._track(t, func.__name__)
        return out

