"""Compiles the graphs AOTAutograd hands us (neuron fakes) into host code: Inductor for CPU.

AOTAutograd runs on the neuron graph, so autograd, views, input mutation and buffer updates are
handled with neuron tensors as on any device. Each forward/backward graph it produces is
rewritten to CPU (device literals and every value's metadata), compiled by Inductor's inner
compiler for CPU, and wrapped: at run time neuron inputs are passed as CPU aliases of the same
bytes and the outputs come back as neuron tensors without a copy (``_enter/_exit_compiled_call``
in csrc/compiled_calls.cpp).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx

NEURON = "neuron"
_CPU = torch.device("cpu")


def _to_cpu_device(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == NEURON:
        return _CPU
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu_device(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu_device(v) for k, v in value.items()}
    return value


def _cpu_fake(value: Any, fake_mode) -> Any:
    """A CPU fake with the metadata of a neuron (fake) tensor; anything else unchanged."""
    if not isinstance(value, torch.Tensor) or value.device.type != NEURON:
        return value
    with fake_mode:
        cpu = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_CPU)
        if value.storage_offset():
            cpu = cpu.as_strided(value.shape, value.stride(), value.storage_offset())
    return cpu


def rewrite_to_cpu(gm: torch.fx.GraphModule, fake_mode) -> None:
    """Make ``gm`` a CPU graph: device arguments and each node's fake value move to CPU."""
    for node in gm.graph.nodes:
        node.args = _to_cpu_device(node.args)
        node.kwargs = _to_cpu_device(node.kwargs)
        if "val" in node.meta:
            node.meta["val"] = torch.utils._pytree.tree_map(lambda v: _cpu_fake(v, fake_mode), node.meta["val"])
    gm.recompile()


def has_neuron_values(gm: torch.fx.GraphModule) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == NEURON
               for node in gm.graph.nodes
               for v in torch.utils._pytree.tree_leaves(node.meta.get("val")))


def run_on_neuron(compiled: Callable) -> Callable:
    """Wrap a CPU-compiled boxed callable so it takes and returns neuron tensors, zero-copy."""
    enter, leave, abort = (torch.ops.neuron._enter_compiled_call, torch.ops.neuron._exit_compiled_call,
                           torch.ops.neuron._abort_compiled_call)

    def call(args: list) -> Any:
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        aliases = enter([args[i] for i in positions])
        cpu_args = list(args)
        for i, alias in zip(positions, aliases):
            cpu_args[i] = alias
        args.clear()  # boxed convention: the callee owns the inputs
        try:
            outputs = compiled(cpu_args)
        except BaseException:
            abort()
            raise
        flat, spec = torch.utils._pytree.tree_flatten(outputs)
        tensor_slots = [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor)]
        mapped = leave([flat[i] for i in tensor_slots])
        for i, t in zip(tensor_slots, mapped):
            flat[i] = t
        return torch.utils._pytree.tree_unflatten(flat, spec)

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def cpu_example_inputs(example_inputs: Sequence[Any], fake_mode) -> list:
    return [_cpu_fake(v, fake_mode) for v in example_inputs]
