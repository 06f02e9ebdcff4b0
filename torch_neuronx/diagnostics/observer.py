"""Collection: while diagnostics are on, the core keeps the per-call bookkeeping and hands
:func:`_observe` the calls that may make a finding.

The core (op tracking level 2, csrc/op_tracking.cpp) counts each call under its signature (op,
shapes, dtypes and devices of its tensors) and the current phase, and samples memory onto the
timeline. Python sees the first call of each signature: it records the signature's key and result
metadata, checks the call for findings and tells the core which later calls need checking (an op
that always makes a finding, float64 tensors, a host sync; int64 tensors, checked by value in the
core). The source line is captured only when a finding is made. Compiled graphs are recorded once
when compiled (their ops run on FakeTensors) and counted per call: the compiler calls this module
through the hook that :func:`start` installs in :mod:`torch_neuronx.runtime.hooks`. Collection adds
work to every eager op, so it is off by default.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from torch_neuronx.interop import ecosystem_errors
from torch_neuronx.diagnostics import findings, safetensors_watch
from torch_neuronx.trainium import attention, time_model
from torch_neuronx.trainium.cost_model import TensorMeta
from torch_neuronx.python_ops import op_classes
from torch_neuronx.runtime import BACKEND_NAME, frames, hooks, ops

DEFAULT_PHASE = "run"


@dataclass(frozen=True)
class Signature:
    """One distinct op call: in TorchNeuron's eager mode, one NEFF compile."""

    op: str
    inputs: tuple[TensorMeta, ...]

    @property
    def family(self) -> str:
        return op_classes.family(self.op)

    @staticmethod
    def of_key(key: tuple) -> Signature:
        op, metas = key
        return Signature(op, tuple(TensorMeta(*m) for m in metas))


def _metas(tensors: list[torch.Tensor]) -> tuple:
    # Plain tuples on the hot path: hashing them is C code, a dataclass's is Python.
    return tuple((tuple(t.shape), t.dtype, t.device.type) for t in tensors)


@dataclass
class PhaseRecord:
    name: str
    index: int = 0  # the phase's number in the core, which counts the calls
    seconds: float = 0.0
    calls: Counter = field(default_factory=Counter)  # signature key (op, input metas) -> calls (read from the core)
    graph_calls: Counter = field(default_factory=Counter)  # compiled graph name -> calls


@dataclass
class CompiledGraph:
    name: str
    ops: list[tuple[str, tuple[TensorMeta, ...], tuple[TensorMeta, ...]]]
    error: str = ""
    stablehlo_ops: Counter = field(default_factory=Counter)  # by kind, over its forward/backward parts
    lowering_s: float = 0.0
    # Each graph AOTAutograd made of it (forward, backward, inference): "lowered" or "failed: op (stage)".
    parts: dict[str, str] = field(default_factory=dict)
    not_checked: str = ""  # why the lowering could not be checked, when it could not
    fused: list = field(default_factory=list)  # one call as one NEFF: (precision, FLOPs, HBM bytes) per op

    @property
    def kind(self) -> str | None:
        return " + ".join(self.parts) or None

    @property
    def lowering(self) -> str:
        """"failed" when any part failed, why the check stopped when it did (even after some parts
        lowered: the others were not), "lowered" when every part lowered."""
        if any(part.startswith("failed") for part in self.parts.values()):
            return "failed"
        if self.not_checked:
            return f"not checked: {self.not_checked}"[:300]
        return "lowered" if self.parts else "not lowered"


class Collector:
    """What one collection gathered. The calls are counted in the core (one collector at a time):
    ``phases`` and ``timeline`` read them from there until :meth:`stop_counting` keeps a copy."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        ops._observer_reset()  # the core's counts and timeline start now, with this collector
        self.started = time.perf_counter()
        self.results: dict[tuple, tuple] = {}  # signature key -> the first call's result metas
        self.keys: dict[int, tuple] = {}  # the core's signature number -> signature key
        self._phases: dict[str, PhaseRecord] = {}
        self._current = self._phase(DEFAULT_PHASE)
        self.phase_started = self.started
        self.detector = findings.Detector()
        self.graphs: dict[str, CompiledGraph] = {}
        self._kept: tuple[list, list] | None = None  # the core's counts and timeline, once stopped
        from torch._dynamo.utils import get_compilation_metrics

        # Held, and compared by identity: compile ids repeat after torch._dynamo.reset().
        self.earlier_compilations = get_compilation_metrics()
        self.sample_memory()  # the timeline starts where the program is

    def _phase(self, name: str) -> PhaseRecord:
        if name not in self._phases:
            self._phases[name] = PhaseRecord(name, len(self._phases))
        return self._phases[name]

    def _core_state(self) -> tuple[list, list]:
        """(signature number, phase number, calls) triples and the (seconds, bytes) timeline."""
        if self._kept is not None:
            return self._kept
        signatures, phases, calls = ops._observer_calls()
        seconds, allocated = ops._observer_timeline()
        return list(zip(signatures, phases, calls)), list(zip(seconds, allocated))

    def stop_counting(self) -> None:
        """Keep the core's counts here: the next collector starts the core afresh."""
        with self.lock:
            if self._kept is None:
                self._kept = self._core_state()

    @property
    def phases(self) -> dict[str, PhaseRecord]:
        """Each phase with its calls by signature key, as counted so far."""
        with self.lock:
            counts, _ = self._core_state()
            by_index = {p.index: p for p in self._phases.values()}
            for record in by_index.values():
                record.calls = Counter()
            for signature, phase_index, calls in counts:
                key, record = self.keys.get(signature), by_index.get(phase_index)
                if key is not None and record is not None:
                    record.calls[key] += calls
            return self._phases

    @property
    def phase(self) -> PhaseRecord:
        """The current phase (its calls as counted so far)."""
        with self.lock:
            return self.phases[self._current.name]

    @property
    def timeline(self) -> list[tuple[float, int]]:
        """(seconds since start, bytes allocated on the current device) samples."""
        with self.lock:
            return list(self._core_state()[1])

    @property
    def observed(self) -> int:
        """Calls observed so far."""
        with self.lock:
            return sum(calls for _, _, calls in self._core_state()[0])

    def switch_phase(self, name: str) -> str:
        self.sample_memory()  # phase boundaries are on the timeline, however few ops ran
        with self.lock:
            now = time.perf_counter()
            self._current.seconds += now - self.phase_started
            previous, self._current, self.phase_started = self._current.name, self._phase(name), now
            if self._kept is None:
                ops._observer_set_phase(self._current.index)
            return previous

    def close_phase(self) -> None:
        self.switch_phase(self._current.name)

    def observe(self, op: str, inputs: list[torch.Tensor], results: list[torch.Tensor], signature: int = -1) -> int:
        """A call the core hands over: the first of a new signature (``signature`` its number in the
        core), or a later one its flags select. Returns a new signature's flags (see findings.Detector)."""
        # A Python number passed as a tensor (x * 2) reaches Python as the number: not a tensor argument.
        inputs = [t for t in inputs if isinstance(t, torch.Tensor)]
        flags = 0
        if signature >= 0:
            key = (op, _metas(inputs))
            with self.lock:
                self.keys[signature] = key
                if key not in self.results:
                    self.results[key] = _metas(results)
            flags = self.detector.signature_flags(op, inputs, results)
        self.detector.check_call(op, inputs, results)
        return flags

    def sample_memory(self) -> None:
        with self.lock:
            if self._kept is None:
                ops._observer_sample_memory()

    def graph_called(self, name: str) -> None:
        with self.lock:
            self.phase.graph_calls[name] += 1


_collector: Collector | None = None
_last: Collector | None = None  # the last one stopped, still reportable


def active() -> Collector | None:
    return _collector


def last() -> Collector | None:
    return _last


def _observe(op: str, inputs: list[torch.Tensor], results: list[torch.Tensor], signature: int) -> int:
    collector = _collector
    if collector is None:
        return 0
    return collector.observe(op, inputs, results, signature)


def _library_error(kind: str, call: str, detail: str) -> None:
    """A library failing on neuron as it would on Trainium (torch_neuronx.interop.ecosystem_errors)."""
    collector = _collector
    if collector is not None:
        site, _ = findings.user_site()
        collector.detector.add(kind, call, site, detail)


ecosystem_errors.listen(_library_error)


def record_error(error: BaseException) -> bool:
    """An error the program stopped on: a finding at its line when Trainium raises it too (another
    rank's core under torchrun, say). Whether it made one."""
    collector = _collector or _last
    finding = findings.error_finding(error)
    if collector is None or finding is None:
        return False
    collector.detector.add(finding.kind, finding.op, finding.site, finding.detail)
    return True

_observer_library = torch.library.Library(BACKEND_NAME, "IMPL")  # the core calls neuron::_observe_op
_observer_library.impl("_observe_op", _observe, "CPU")


def start() -> Collector:
    """Start collecting (a no-op if already collecting); returns the collector."""
    global _collector
    if _collector is None:
        _collector = Collector()
        ops._set_op_tracking_level(2)
        safetensors_watch.install()
        hooks.install_compiled_graph_observer(_CompiledGraphHook())
    return _collector


def stop() -> Collector | None:
    """Stop collecting; returns what was collected (kept for :func:`report`)."""
    global _collector, _last
    collector = _collector
    if collector is not None:
        ops._set_op_tracking_level(1)
        safetensors_watch.uninstall()
        hooks.install_compiled_graph_observer(None)
        collector.close_phase()
        collector.stop_counting()
        _collector, _last = None, collector
    return collector


def clear() -> None:
    """Forget what was collected; collection stays on if it was."""
    global _collector, _last
    _last = None
    if _collector is not None:
        _collector = Collector()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Attribute the ops run inside to phase ``name`` in the report (does nothing when not collecting)."""
    collector = _collector
    if collector is None:
        yield
        return
    previous = collector.switch_phase(name)
    try:
        yield
    finally:
        collector.switch_phase(previous)


# ---- compiled graphs ---------------------------------------------------------------------------
class _GraphOpRecorder(TorchDispatchMode):
    """Records the aten ops of a graph replayed on FakeTensors, each with the user line of its node."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[TensorMeta, ...], tuple[TensorMeta, ...]]] = []
        self.sites: list[str] = []  # per op: the user line its graph node came from
        self.site = "<unknown>"
        self.account = time_model.FusedAccount()
        self.fused: list[tuple[str, int, int]] = []  # per op, then the outputs: (precision, FLOPs, HBM bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Views move no data (and in eager they never reach the host dispatch path either);
        # prim:: ops (prim::device) return no tensors.
        if isinstance(func, torch._ops.OpOverload) and not func.is_view and func.namespace != "prim" \
                and func.name() != "aten::_unsafe_view":
            name = func._schema.name + ("" if func._overloadname == "default" else f".{func._overloadname}")
            inputs = time_model.keyed_metas(tree_leaves((args, kwargs)))
            results = time_model.keyed_metas(tree_leaves(out))
            self.ops.append((name, tuple(m for _, m in inputs), tuple(m for _, m in results)))
            self.fused.append(self.account.op(name, inputs, results))
            self.sites.append(self.site)
        return out


def _node_site(node: torch.fx.Node) -> str:
    """The innermost frame of a Dynamo node's stack trace outside torch and torch_neuronx: the user's line."""
    trace = []
    for line in (node.meta.get("stack_trace") or "").splitlines():
        line = line.strip()
        if line.startswith('File "') and ", line " in line:
            filename, _, rest = line[len('File "'):].partition('", line ')
            trace.append((filename, rest.split(",", 1)[0]))
    for filename, lineno in reversed(trace):
        if not frames.is_library(filename):
            return f"{filename}:{lineno}"
    return ""  # Dynamo keeps no trace for code inside torch (nn modules): the caller names the call


class _SitedInterpreter(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, recorder: _GraphOpRecorder) -> None:
        super().__init__(gm)
        self.recorder = recorder

    def run_node(self, node: torch.fx.Node):
        self.recorder.site = _node_site(node)
        return super().run_node(node)


def backward_graph_name(name: str) -> str:
    """The name of the backward graph AOTAutograd makes of compiled graph ``name``: one NEFF of its own."""
    return f"{name}.backward"


def _replayed(name: str, gm: torch.fx.GraphModule, example_inputs) -> tuple[CompiledGraph, _GraphOpRecorder]:
    """A graph replayed on FakeTensors, its aten ops recorded (with their user lines)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_neuronx.neuron_dynamo_backend.host_graph import copy_graph_module

    recorder = _GraphOpRecorder()
    graph = CompiledGraph(name, recorder.ops)
    try:
        gm = copy_graph_module(gm)
        attention.as_on_trainium(gm)  # the attention Trainium would run, costed
        # A fresh fake mode and new fakes: Dynamo's own inputs and fakes stay untouched.
        with FakeTensorMode(), torch.no_grad():
            inputs = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                      if isinstance(x, torch.Tensor) else x for x in example_inputs]
            for key, meta in time_model.keyed_metas(inputs):
                recorder.account.add_input(key, meta.nbytes)
            with recorder:
                outputs = _SitedInterpreter(gm, recorder).run(*inputs)
            recorder.fused.append(("fp32", 0, recorder.account.finish(time_model.keyed_metas(tree_leaves(outputs)))))
            graph.fused = recorder.fused
    except Exception as error:  # a graph we cannot replay is reported, never fatal
        graph.error = f"{type(error).__name__}: {error}"[:200]
    return graph, recorder


def record_compiled_graph(name: str, gm: torch.fx.GraphModule, example_inputs) -> None:
    """Replay a Dynamo graph on FakeTensors: keep its ops, to cost each call of the compiled graph,
    and check them for findings (what a NEFF would narrow or leave to the CPU) at their user lines."""
    collector = _collector
    if collector is None:
        return
    graph, recorder = _replayed(name, gm, example_inputs)
    called_at, _ = findings.user_site()  # the user's call that compiled this graph
    for (op, inputs_meta, results_meta), site in zip(recorder.ops, recorder.sites):
        collector.detector.check_graph_op(op, inputs_meta, results_meta, site or f"{called_at} (compiled)")
    with collector.lock:
        collector.graphs[name] = graph


def record_backward_graph(name: str, gm: torch.fx.GraphModule, example_inputs) -> None:
    """The backward graph of compiled graph ``name``, as AOTAutograd made it: its ops cost each
    backward call. Its findings are the forward's (the same user lines), so none are added here.
    The compiler hands it over before lowering it, so its lowering is recorded on this entry."""
    collector = _collector
    if collector is None:
        return
    backward = backward_graph_name(name)
    graph, _ = _replayed(backward, gm, example_inputs)
    with collector.lock:
        collector.graphs[backward] = graph


def _training_node(outputs) -> torch.autograd.graph.Node | None:
    """The autograd node that most of a compiled call's outputs come from: its backward graph's call."""
    nodes = Counter(out.grad_fn for out in tree_leaves(outputs)
                    if isinstance(out, torch.Tensor) and out.grad_fn is not None)
    return nodes.most_common(1)[0][0] if nodes else None


def count_calls(name: str, compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled graph's callable so each call is counted in the current phase, and each call
    of its backward graph (when the call trains) in the phase the backward runs in."""
    backward = backward_graph_name(name)

    def call(*args):
        collector = _collector
        if collector is None or name not in collector.graphs:
            return compiled(*args)
        collector.graph_called(name)
        outputs = compiled(*args)
        node = _training_node(outputs)
        if node is not None:
            node.register_hook(lambda grad_inputs, grad_outputs: collector.graph_called(backward))
        return outputs

    call.__wrapped__ = compiled
    return call


def record_lowering(name: str, result: Any, seconds: float, kind: str = "graph") -> None:
    """A graph AOTAutograd made of compiled graph ``name`` (its ``kind``: forward, backward or
    inference) lowered to StableHLO (its op counts), or the error that stopped it: an op that does
    not lower becomes a ``stablehlo-lowering`` finding at its line."""
    collector = _collector
    if collector is None:
        return
    failed = hasattr(result, "stage")  # lowering.LoweringError
    if kind == "backward":
        name = backward_graph_name(name)
    with collector.lock:
        graph = collector.graphs.get(name)
        if graph is None:
            graph = collector.graphs[name] = CompiledGraph(name, [])
        graph.lowering_s += seconds
        counts = getattr(result, "op_counts", None)
        if counts is not None:
            graph.stablehlo_ops.update(counts)
            graph.parts[kind] = "lowered"
        elif failed:
            graph.parts[kind] = f"failed: {result.op} ({result.stage})"
        else:
            graph.not_checked = str(result)
    if failed:
        site = result.site or f"{findings.user_site()[0]} (compiled)"
        collector.detector.add("stablehlo-lowering", result.op, site,
                               f"{kind} graph, stage {result.stage}: {result.detail}"[:300])


class _CompiledGraphHook:
    """What the compiler calls while collecting (see torch_neuronx.runtime.hooks)."""

    record_compiled_graph = staticmethod(record_compiled_graph)
    record_backward_graph = staticmethod(record_backward_graph)
    count_calls = staticmethod(count_calls)
    record_lowering = staticmethod(record_lowering)
