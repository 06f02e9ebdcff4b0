"""The runtime of compiled graphs: a CPU-compiled graph run on neuron tensors' own bytes.

Neuron inputs are passed as CPU aliases of the same bytes and the outputs come back as neuron
tensors without a copy (``_enter/_exit_compiled_call_any`` in csrc/compiled_calls.cpp). When
gradients flow, both ends are autograd nodes in C++: the CPU graph's autograd (AOTAutograd's)
sits between them in the one neuron graph, so a backward pass runs the compiled backward on CPU
aliases of the incoming gradients and adopts what it returns, without Python in between.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from torch_neuronx.neuron_dynamo_backend.exceptions import NEFFExecutionError
from torch_neuronx.runtime import BACKEND_NAME, ops


def _failed(error: BaseException) -> None:
    """Pop the alias frame of a call whose compiled graph raised; say which part failed."""
    ops._abort_compiled_call()
    if isinstance(error, Exception):
        raise NEFFExecutionError(f"a neuron compiled graph failed while running: {type(error).__name__}: "
                                 f"{error}") from error


def _run(compiled: Callable, args: Sequence[Any], positions: list[int], aliases: list) -> tuple[list, Any]:
    """Call ``compiled`` with ``aliases`` in place of the tensor arguments; returns (flat
    outputs, their tree spec)."""
    cpu_args = list(args)
    for i, alias in zip(positions, aliases):
        cpu_args[i] = alias
    try:
        outputs = compiled(*cpu_args)
    except BaseException as error:
        _failed(error)
        raise
    return torch.utils._pytree.tree_flatten(outputs)


def _map_back(flat: list, slots: list[int], mapped: Sequence[torch.Tensor], spec) -> Any:
    flat = list(flat)
    for i, t in zip(slots, mapped):
        flat[i] = t
    return torch.utils._pytree.tree_unflatten(flat, spec)


def run_graph_on_neuron(compiled: Callable, leading: Sequence[torch.Tensor] = ()) -> Callable:
    """Wrap a CPU-compiled graph so it takes and returns neuron tensors, zero-copy; ``leading``
    (the lifted tensor attributes) go before the caller's arguments on every call. The core's
    enter picks the differentiable form when grad mode is on and an input requires grad, and
    the exit follows it, so a call costs Python one list and two op calls."""
    leading = tuple(leading)
    enter, leave = ops._enter_compiled_call_any.default, ops._exit_compiled_call_any.default
    tensor_type = torch.Tensor

    def call(*args):
        if leading:
            args = (*leading, *args)
        tensors = [a for a in args if isinstance(a, tensor_type)]
        if len(tensors) == len(args):  # the usual graph: tensors in, a list/tuple of tensors out
            try:
                outputs = compiled(*enter(tensors))
            except BaseException as error:
                _failed(error)
                raise
            kind = type(outputs)
            if (kind is list or kind is tuple) and all(isinstance(o, tensor_type) for o in outputs):
                return kind(leave(outputs))
            flat, spec = torch.utils._pytree.tree_flatten(outputs)
        else:
            positions = [i for i, a in enumerate(args) if isinstance(a, tensor_type)]
            flat, spec = _run(compiled, args, positions, enter(tensors))
        slots = [i for i, o in enumerate(flat) if isinstance(o, tensor_type)]
        return _map_back(flat, slots, leave([flat[i] for i in slots]), spec)

    return call


def apply_device_rules(call: Callable, refuse_cpu_inputs: bool, retain_device: bool) -> Callable:
    """TorchNeuron's input-device rules around a compiled graph's entry. A CPU tensor input is read in
    place here (TorchNeuron copies it to the device first: the same numbers). With ``refuse_cpu_inputs``
    it raises instead; with ``retain_device``, outputs of a call whose inputs are all on CPU come back
    on CPU, and inputs on several devices raise."""
    if not (refuse_cpu_inputs or retain_device):
        return call

    def checked(*args):
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        if refuse_cpu_inputs:
            for index, a in enumerate(args):
                if isinstance(a, torch.Tensor) and a.device.type == "cpu":
                    raise RuntimeError(f"Input tensor at index {index} is on cpu device, expected {BACKEND_NAME}. "
                                       f"Move tensor to Neuron device first with tensor.to('{BACKEND_NAME}')")
        if retain_device and len(devices) > 1:
            raise NEFFExecutionError(f"cannot mix input devices with TORCH_NEURONX_RETAIN_DEVICE_MODE=1, got "
                                     f"{' and '.join(sorted(devices))}")
        outputs = call(*args)
        if retain_device and devices == {"cpu"}:
            return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("cpu"), outputs)
        return outputs

    return checked
