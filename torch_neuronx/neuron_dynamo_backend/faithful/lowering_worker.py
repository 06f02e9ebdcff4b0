"""Lowering to StableHLO in a worker process, so that the compiler crashing cannot end the program.

torch-mlir's passes abort the process on some graphs (``LLVM ERROR: ...`` on a cast to complex, a
segfault on one of logsumexp's samples). A fatal error in a native library cannot be caught in the
process it happens in, and readiness lowers every compiled graph while it observes: asking for the
report must never kill the program it reports on. So each graph is lowered by :func:`lower` in one
long-lived worker (started on first use, then kept, so a graph costs its lowering and a pickle).

The graph crosses as a description (each node's op, target, arguments and the metadata lowering
reads: value shapes and dtypes, stack traces, module paths), rebuilt in the worker on fake tensors.
When the worker dies, the prefix of the graph that still kills it is narrowed down by bisection (a
new worker after each death) to name the op, and :class:`~.lowering.LoweringError` says "the
compiler crashed". A graph that cannot be described (a target that is not an aten op, a fake
constant) is lowered in this process, as before.
"""
from __future__ import annotations

import atexit
import dataclasses
import importlib
import operator
import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading

import torch

from torch_neuronx.neuron_dynamo_backend.faithful import lowering

_HEADER = struct.Struct("<Q")
# Variables that would make the worker observe itself or print a report of its own.
_WORKER_DROPS = ("TORCH_NEURONX_REPORT",)
_STDERR_TAIL = 4000


class _Unportable(Exception):
    """The graph holds something the worker could not rebuild."""


@dataclasses.dataclass(frozen=True)
class _Ref:
    name: str  # a node of the graph, by name


# -- the graph as a description ---------------------------------------------------------------------------

def _defining_module(op: torch._ops.OpOverload) -> str | None:
    """The module a custom op (``torch.library.custom_op``) is defined in, which the worker must import
    for the op to exist there; None for built-in ops."""
    if op.namespace in ("aten", "prims"):
        return None
    from torch._library.custom_ops import OPDEFS

    definition = OPDEFS.get(op.name().split(".")[0])
    return getattr(getattr(definition, "_init_fn", None), "__module__", None)


def _target(node: torch.fx.Node):
    target = node.target
    if node.op in ("placeholder", "output", "get_attr"):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return ("op", target.name(), _defining_module(target))
    if target is operator.getitem:
        return target
    raise _Unportable(f"{node.op} {target!r}")


def _value(value):
    if isinstance(value, torch.Tensor):
        if any(not isinstance(s, int) for s in (*value.shape, *value.stride())):
            raise _Unportable("a symbolic shape")
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_value(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    return None  # lowering reads tensors' types only


def _argument(value):
    if isinstance(value, torch.fx.Node):
        return _Ref(value.name)
    if isinstance(value, (list, tuple)):
        return type(value)(_argument(v) for v in value)
    if isinstance(value, dict):
        return {k: _argument(v) for k, v in value.items()}
    if isinstance(value, (torch.Tensor, torch.fx.GraphModule)):
        raise _Unportable("a tensor argument")
    return value


def _meta(node: torch.fx.Node) -> dict:
    meta = {"val": _value(node.meta.get("val"))}
    if node.meta.get("stack_trace"):
        meta["stack_trace"] = node.meta["stack_trace"]
    stack = node.meta.get("nn_module_stack")
    if stack:
        meta["nn_module_stack"] = {key: (str(where), getattr(kind, "__name__", str(kind)))
                                   for key, (where, kind) in stack.items()}
    return meta


def describe(gm: torch.fx.GraphModule) -> dict:
    """A picklable description of ``gm`` that :func:`rebuild` turns back into a graph."""
    nodes, constants = [], {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            constant = getattr(gm, node.target)
            if not isinstance(constant, torch.Tensor) or isinstance(constant, torch._subclasses.FakeTensor):
                raise _Unportable(f"constant {node.target}")
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # a real constant, copied while AOTAutograd's fake mode is on
                constants[node.target] = constant.detach().cpu().clone()
        nodes.append((node.op, node.name, _target(node), _argument(node.args), _argument(node.kwargs), _meta(node)))
    return {"nodes": nodes, "constants": constants}


def _prefix(description: dict, count: int) -> dict:
    """The graph's first ``count`` ops, returning every tensor they make."""
    nodes, kept, outputs = [], 0, []
    for op, name, target, args, kwargs, meta in description["nodes"]:
        if op == "output":
            break
        if op == "call_function":
            if kept == count:
                break
            kept += 1
            if isinstance(meta.get("val"), tuple) and meta["val"][:1] == ("tensor",):
                outputs.append(_Ref(name))
        nodes.append((op, name, target, args, kwargs, meta))
    nodes.append(("output", "output", "output", (tuple(outputs),), {}, {"val": None}))
    return {"nodes": nodes, "constants": description["constants"]}


def _ops_in_order(description: dict) -> list[tuple[str, dict]]:
    return [(target, meta) for op, _, target, _, _, meta in description["nodes"] if op == "call_function"]


def rebuild(description: dict) -> torch.fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode()
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}

    def resolve(value):
        if isinstance(value, _Ref):
            return made[value.name]
        if isinstance(value, (list, tuple)):
            return type(value)(resolve(v) for v in value)
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    def fake(value):
        if isinstance(value, tuple) and value[:1] == ("tensor",):
            _, shape, stride, dtype = value
            with fake_mode:
                return torch.empty_strided(shape, stride, dtype=dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(fake(v) for v in value)
        return value

    for op, name, target, args, kwargs, meta in description["nodes"]:
        if isinstance(target, tuple) and target[:1] == ("op",):
            if target[2] is not None:
                importlib.import_module(target[2])
            namespace, _, rest = target[1].partition("::")
            packet, _, overload = rest.partition(".")
            target = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
        node = graph.create_node(op, target, resolve(args), resolve(kwargs), name=name)
        node.meta.update(meta)
        node.meta["val"] = fake(meta.get("val"))
        made[name] = node
    root = torch.nn.Module()
    for target, constant in description["constants"].items():
        setattr(root, target, constant)
    return torch.fx.GraphModule(root, graph)


# -- the worker process -----------------------------------------------------------------------------------

def _send(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (length,) = _HEADER.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError
    return pickle.loads(data)


def _serve() -> None:
    """The worker's loop: a description in, a LoweredGraph or a LoweringError's fields out."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies
    requests = sys.stdin.buffer
    lowering.require_torch_mlir()
    while True:
        try:
            description, name = _receive(requests)
        except EOFError:
            return
        try:
            reply = ("lowered", lowering.lower(rebuild(description), name))
        except lowering.LoweringError as error:
            reply = ("refused", (error.op, error.stage, error.site, error.detail))
        except Exception as error:  # noqa: BLE001 - reported to the caller, who raises it
            reply = ("failed", f"{type(error).__name__}: {error}")
        _send(replies, reply)


class _WorkerDied(Exception):
    def __init__(self, code: int, stderr: str):
        super().__init__(_describe_exit(code))
        self.how, self.code, self.stderr = _describe_exit(code), code, stderr

    @property
    def crashed(self) -> bool:
        """Killed by a signal (an abort, a segfault), not a Python error it could report."""
        return self.code < 0


class _Worker:
    def __init__(self) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.startswith(_WORKER_DROPS)}
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-c", f"import {__name__} as worker; worker._serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=environment)

    def alive(self) -> bool:
        return self._process.poll() is None

    def lower(self, description: dict, name: str):
        start = self._stderr.seek(0, os.SEEK_END)
        try:
            _send(self._process.stdin, (description, name))
            return _receive(self._process.stdout)
        except (EOFError, BrokenPipeError, OSError):
            code = self._process.wait()
            self._stderr.seek(start)
            stderr = self._stderr.read().decode(errors="replace")[-_STDERR_TAIL:]
            raise _WorkerDied(code, stderr) from None

    def close(self) -> None:
        if self.alive():
            self._process.stdin.close()
            self._process.wait()
        self._stderr.close()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


_lock = threading.Lock()
_worker: _Worker | None = None


def _current_worker() -> _Worker:
    global _worker
    if _worker is None or not _worker.alive():
        if _worker is None:
            atexit.register(shutdown)
        _worker = _Worker()
    return _worker


def shutdown() -> None:
    """Stop the worker (started again on the next lowering)."""
    global _worker
    with _lock:
        if _worker is not None:
            _worker.close()
            _worker = None


def _reply(description: dict, name: str) -> lowering.LoweredGraph:
    kind, value = _current_worker().lower(description, name)
    if kind == "lowered":
        return value
    if kind == "refused":
        raise lowering.LoweringError(*value)
    raise RuntimeError(f"lowering failed in the worker: {value}")


def _crashing_op(description: dict) -> int | None:
    """The index of the first op whose prefix of the graph still kills the worker, by bisection."""
    low, high = 1, len(_ops_in_order(description))
    if high == 0:
        return None
    try:
        _reply(_prefix(description, high), "bisect")
        return None  # only the whole graph crashes: no single op to blame
    except _WorkerDied:
        pass
    except Exception:  # noqa: BLE001 - a prefix that is refused does not crash
        return None
    while low < high:
        middle = (low + high) // 2
        try:
            _reply(_prefix(description, middle), "bisect")
            low = middle + 1
        except _WorkerDied:
            high = middle
        except Exception:  # noqa: BLE001
            low = middle + 1
    return low - 1


def _crash_error(description: dict, died: _WorkerDied) -> lowering.LoweringError:
    index = _crashing_op(description)
    message = next((line.strip() for line in died.stderr.splitlines() if "ERROR" in line), "")
    detail = f"the compiler crashed ({died.how})" + (f": {message}" if message else "")
    if index is None:
        return lowering.LoweringError("an op", "crash", "", detail)
    target, meta = _ops_in_order(description)[index]
    op = target[1].replace("::", ".") if isinstance(target, tuple) else getattr(target, "__name__", str(target))
    return lowering.LoweringError(op, "crash", lowering.site_from_trace(meta.get("stack_trace")), detail)


def lower(gm: torch.fx.GraphModule, name: str = "main") -> lowering.LoweredGraph:
    """:func:`.lowering.lower`, run in the worker: the same result or LoweringError, and a crash of
    the compiler is a LoweringError too (stage ``crash``), never the end of this process."""
    lowering.require_torch_mlir()
    try:
        description = describe(gm)
    except _Unportable:
        return lowering.lower(gm, name)
    with _lock:
        try:
            return _reply(description, name)
        except _WorkerDied as died:
            if not died.crashed:  # it could not start or serve: an installation problem, not the graph's
                raise RuntimeError(f"the lowering worker process {died.how}:\n{died.stderr.strip()}") from None
            raise _crash_error(description, died) from None
