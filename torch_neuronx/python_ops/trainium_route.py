"""What a composite op runs on Trainium, told to op tracking while its values come from CPU's route.

The host route (:mod:`.host_route`) runs a composite such as ``aten::rnn_tanh`` as CPU runs it, for
CPU's values bit for bit. On Trainium the same composite takes ATen's route for any device but CPU:
step by step, each step's linear layers (``addmm``), ``add`` and ``tanh`` their own kernel calls,
each with its kernel key and NEFF. So that op tracking, the readiness report and its estimate count
what Trainium runs (as the plan simulator, whose fake tensors take that route, does), that route is
recorded once per signature, on meta tensors (no data, no random draws), forward and backward, and
each of its calls is replayed into op tracking: counted, and observed with tensors of its shapes
(views over the call's own storages: nothing is allocated). Views are not replayed, as neuron's
view kernels are not tracked. The backward is recorded for every result's gradient.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from torch_neuronx.runtime import ops

_OBSERVING = 2  # op tracking's level while diagnostics observe calls


@dataclasses.dataclass(frozen=True)
class Call:
    """One kernel call of the route: the op's tracked name and its tensors' shapes and dtypes."""
    name: str
    inputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    results: tuple[tuple[tuple[int, ...], torch.dtype], ...]


@dataclasses.dataclass(frozen=True)
class Route:
    """Each direction's distinct calls, in the order first made, with how often each is made."""
    forward: tuple[tuple[Call, int], ...]
    backward: tuple[tuple[Call, int], ...]


def _grouped(calls: list[Call]) -> tuple[tuple[Call, int], ...]:
    return tuple(collections.Counter(calls).items())  # a Counter keeps the order of first sight


def _is_view(func) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _specs(values) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor))


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.namespace == "aten" and not _is_view(func):
            overload = func._overloadname
            name = func._schema.name.partition("::")[2] + ("" if overload == "default" else f".{overload}")
            self.calls.append(Call(name, _specs((args, kwargs)), _specs(result)))
        return result


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, value.requires_grad)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    return repr(value)


_routes: dict[Any, Route | None] = {}  # None: the route could not be recorded
_MAX_ROUTES = 256  # signatures kept; a program with more records again


def route_of(op, args: Sequence[Any], cpu_arguments: tuple[int, ...] = ()) -> Route | None:
    """The calls ``op`` makes on Trainium's route for ``args`` (neuron tensors; those at ``cpu_arguments``
    are read on the CPU by every route, as packed sequences' batch sizes): recorded once per signature.
    None when the route cannot be recorded: the op is then tracked under its own name."""
    signature = tuple(_signature(a) if i not in cpu_arguments else ("values", _signature(a), repr(a.tolist()))
                      for i, a in enumerate(args))
    key = (op, signature, torch.is_grad_enabled())
    if key not in _routes:
        if len(_routes) >= _MAX_ROUTES:
            _routes.clear()
        try:
            _routes[key] = _record(op, args, cpu_arguments, torch.is_grad_enabled())
        except Exception:  # noqa: BLE001 - op tracking never breaks the user's op
            _routes[key] = None
    return _routes[key]


def _record(op, args: Sequence[Any], cpu_arguments: tuple[int, ...], grad_enabled: bool) -> Route:
    def to_meta(value):
        if not isinstance(value, torch.Tensor):
            return value
        meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return meta.requires_grad_(value.requires_grad and grad_enabled)

    meta_args = [a if i in cpu_arguments else pytree.tree_map(to_meta, a) for i, a in enumerate(args)]
    leaves = [t for t in pytree.tree_leaves(meta_args) if isinstance(t, torch.Tensor) and t.requires_grad]
    forward = _Recorder()
    with torch.set_grad_enabled(grad_enabled), forward:
        result = op.decompose(*meta_args)
    outputs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.requires_grad]
    backward = _Recorder()
    if leaves and outputs:
        gradients = [torch.ones_like(t) for t in outputs]
        with backward:
            torch.autograd.grad(outputs, leaves, gradients, allow_unused=True)
    return Route(_grouped(forward.calls), _grouped(backward.calls))


def replay(calls: Sequence[tuple[Call, int]], tensors: Sequence[torch.Tensor], storages: Sequence[Any] = ()) -> None:
    """Track each call as often as it is made, observed (while diagnostics observe) with tensors of its
    shapes viewed over the largest storage of ``tensors`` and ``storages`` (those of the call being
    told about)."""
    observing = ops._op_tracking_level() >= _OBSERVING
    held = [*(t.untyped_storage() for t in tensors), *storages]
    storage = max((s for s in held if s.device.type != "cpu"), key=lambda s: s.nbytes(), default=None)
    for call, times in calls:
        shadows = _shadows(storage, [*call.inputs, *call.results]) if observing and storage is not None else None
        if shadows is None:  # not observing, or larger than any storage at hand: counted only
            ops._track_op(call.name, [], [], times)
        else:
            ops._track_op(call.name, shadows[:len(call.inputs)], shadows[len(call.inputs):], times)


def _shadows(storage, specs) -> list[torch.Tensor] | None:
    if any(torch.Size(shape).numel() * dtype.itemsize > storage.nbytes() for shape, dtype in specs):
        return None
    level = ops._op_tracking_level()
    ops._set_op_tracking_level(0)  # making the views is not the user's op
    try:
        return [torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, shape) for shape, dtype in specs]
    finally:
        ops._set_op_tracking_level(level)
