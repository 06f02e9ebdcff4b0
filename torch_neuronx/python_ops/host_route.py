"""CPU's own route for a composite op, run on the neuron tensors' bytes.

Some composite ops (CompositeImplicitAutograd, such as the RNN layers and cells) choose their route
by device: on CPU one sequence of kernels, on any other device
another. The second rounds differently, and an imitation of the first written from neuron ops is
exact only where every kernel happens to get the same shapes and strides as CPU's. So these ops run
the CPU composite itself: the neuron arguments become CPU aliases of the same bytes (no copies),
the op runs on them exactly as it would on CPU, and its results come back as neuron tensors (fresh
memory adopted and counted, aliases mapped to the neuron storage they alias).

Autograd crosses in both directions through two Functions, each of which differentiates to the
other, so a backward (and a backward of a backward, under ``create_graph``) runs CPU's own graph.
Random numbers come from CPU's default generator, as for every other neuron op (as on TorchNeuron).
"""
from __future__ import annotations

import functools
from typing import Callable, Iterable

import torch
from torch.utils import _pytree as pytree

from torch_neuronx.python_ops import trainium_route, trainium_semantics
from torch_neuronx.runtime import BACKEND_NAME, ops


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _aliases(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    aliases = ops._enter_compiled_call(tensors)
    ops._exit_compiled_call([])
    return list(aliases)


def _adopted(cpu_tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    # The anchor gives the results their device; a result over an alias's bytes maps back to the
    # neuron storage it aliases.
    ops._enter_compiled_call([torch.empty(0, device=device)])
    return list(ops._exit_compiled_call(cpu_tensors))


def _across(function: type[torch.autograd.Function], device: torch.device, grads, *before) -> tuple:
    """The gradients that are there taken across by ``function`` (the other direction); a missing
    one stays missing (no zeros made and carried across). ``before``: ``function``'s other arguments."""
    present = [g for g in grads if g is not None]
    crossed = iter(function.apply(device, *before, *present) if present else ())
    return (None, *(None if g is None else next(crossed) for g in grads))


class _IntoHost(torch.autograd.Function):
    @staticmethod
    def forward(ctx, device, *tensors):
        ctx.device = device
        ctx.set_materialize_grads(False)
        return tuple(_aliases(list(tensors)))

    @staticmethod
    def backward(ctx, *grads):
        return _across(_OutOfHost, ctx.device, grads, None, ())


class _OutOfHost(torch.autograd.Function):
    """``told``: what the backward tells op tracking, given the gradients and storages (None: nothing)."""
    @staticmethod
    def forward(ctx, device, told, storages, *cpu_tensors):
        ctx.device, ctx.told = device, told
        ctx.set_materialize_grads(False)
        adopted = _adopted(list(cpu_tensors), device)
        if told is not None:  # the storages the backward's calls are observed over: the op's and these
            ctx.storages = [*storages, *(t.untyped_storage() for t in adopted)]
        return tuple(adopted)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.told is not None:
            ctx.told([g for g in grads if g is not None], ctx.storages)
        return (None, None, *_across(_IntoHost, ctx.device, grads))


def run_on_host(compute: Callable, args) -> tuple:
    """``compute(*args)`` with each tensor argument a CPU alias of its bytes; its results (a tuple) as
    neuron tensors. One kernel call on neuron, without autograd: the ops inside are the kernel's."""
    where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    host = list(args)
    for i, alias in zip(where, ops._enter_compiled_call([args[i] for i in where])):
        host[i] = alias
    try:
        results = compute(*host)
    except BaseException:
        ops._abort_compiled_call()
        raise
    return tuple(ops._exit_compiled_call(list(results)))


def _device_of(op_name: str, tensors: Iterable[torch.Tensor]) -> torch.device:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        found = sorted(str(d) for d in devices)
        raise RuntimeError(f"{op_name}: Expected all tensors to be on the same device, but found at least two "
                           f"devices, {found[0]} and {found[1]}! Move every argument to one neuron device.")
    return devices.pop()


def host_route(op: Callable, name: str, cpu_arguments: tuple[int, ...] = (), refused: str | None = None,
               steps_on_trainium: bool = False) -> Callable:
    """A kernel for the composite ``op`` (named ``name`` in errors) that runs CPU's route on the
    neuron arguments' bytes. ``cpu_arguments`` are the positions the op takes on the CPU on every
    device (packed sequences' ``batch_sizes``); any other tensor must be on one neuron device.
    Random draws inside (dropout between layers) come from CPU's default generator, as on
    TorchNeuron. Traced (fake or
    functional tensors: torch.compile, export), the op decomposes as for any device but CPU, which
    is the graph TorchNeuron's compiler is given. ``refused``: the error TorchNeuron's eager mode raises
    for this op, raised here under ``TORCH_NEURONX_EAGER_SEMANTICS=trainium``. ``steps_on_trainium``:
    op tracking is told the calls of the route Trainium takes (:mod:`.trainium_route`), else the op
    under its name."""
    def kernel(*args):
        flat, spec = pytree.tree_flatten(list(args))
        if any(isinstance(leaf, torch.Tensor) and type(leaf) not in _PLAIN for leaf in flat):
            return op.decompose(*args)
        on_cpu = set()
        for position in cpu_arguments:
            on_cpu.update(id(leaf) for leaf in pytree.tree_leaves(args[position]))
        places = [i for i, leaf in enumerate(flat) if isinstance(leaf, torch.Tensor) and id(leaf) not in on_cpu]
        tensors = [flat[i] for i in places]
        device = _device_of(name, tensors)
        if device.type != BACKEND_NAME:
            raise RuntimeError(f"{name}: the neuron kernel was given {device} tensors only")
        if refused is not None and trainium_semantics.current() == "trainium":
            raise RuntimeError(refused)
        for i, alias in zip(places, _IntoHost.apply(device, *tensors)):
            flat[i] = alias
        route = _route(op, args, cpu_arguments) if steps_on_trainium else None
        result = op(*pytree.tree_unflatten(flat, spec))
        results, result_spec = pytree.tree_flatten(result)
        outputs = [i for i, leaf in enumerate(results) if isinstance(leaf, torch.Tensor)]
        told, storages = (None, ()) if route is None else (functools.partial(_tell_backward, route),
                                                           [t.untyped_storage() for t in tensors])
        for i, adopted in zip(outputs, _OutOfHost.apply(device, told, storages, *(results[i] for i in outputs))):
            results[i] = adopted
        _tell(name, route, tensors, [results[i] for i in outputs])
        return pytree.tree_unflatten(results, result_spec)
    return kernel


def _route(op: Callable, args, cpu_arguments: tuple[int, ...]) -> trainium_route.Route | None:
    """The calls Trainium's route makes, when op tracking is on (off, no one is told: nothing to record)."""
    return trainium_route.route_of(op, args, cpu_arguments) if ops._op_tracking_level() else None


def _tell(name: str, route: trainium_route.Route | None, tensors: list[torch.Tensor],
          results: list[torch.Tensor]) -> None:
    """Op tracking is told the call: its parts ran on CPU aliases, which nothing tracks."""
    if route is not None:
        trainium_route.replay(route.forward, [*tensors, *results])
    elif name.startswith("aten::"):  # tracked and observed under its name
        ops._track_op(name.partition("::")[2], tensors, results)


def _tell_backward(route: trainium_route.Route, grads: list[torch.Tensor], storages) -> None:
    trainium_route.replay(route.backward, grads, storages)
