"""The runtime of compiled graphs: a CPU-compiled graph run on neuron tensors' own bytes.

Neuron inputs are passed as CPU aliases of the same bytes and the outputs come back as neuron
tensors without a copy (``_enter/_exit_compiled_call`` in csrc/compiled_calls.cpp). When
gradients flow, their ``_differentiable`` forms are autograd Functions in C++: the CPU graph's
autograd (AOTAutograd's) sits between them in the one neuron graph, so a backward pass runs the
compiled backward on CPU aliases of the incoming gradients and adopts what it returns, without
Python in between.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from torch_neuronx.neuron_dynamo_backend.exceptions import NEFFExecutionError
from torch_neuronx.runtime import BACKEND_NAME, ops


def _call(compiled: Callable, cpu_args: Sequence[Any]) -> Any:
    """Run the compiled graph on CPU aliases; on failure pop the alias frame and say which part failed."""
    try:
        return compiled(*cpu_args)
    except Exception as error:
        ops._abort_compiled_call()
        raise NEFFExecutionError(f"a neuron compiled graph failed while running: {type(error).__name__}: "
                                 f"{error}") from error
    except BaseException:
        ops._abort_compiled_call()
        raise


def _run(compiled: Callable, args: Sequence[Any], positions: list[int], aliases: list) -> tuple[list, Any]:
    """Call ``compiled`` with ``aliases`` in place of the tensor arguments; returns (flat
    outputs, their tree spec)."""
    cpu_args = list(args)
    for i, alias in zip(positions, aliases):
        cpu_args[i] = alias
    return torch.utils._pytree.tree_flatten(_call(compiled, cpu_args))


def _map_back(flat: list, slots: list[int], mapped: Sequence[torch.Tensor], spec) -> Any:
    flat = list(flat)
    for i, t in zip(slots, mapped):
        flat[i] = t
    return torch.utils._pytree.tree_unflatten(flat, spec)


def run_graph_on_neuron(compiled: Callable, leading: Sequence[torch.Tensor] = ()) -> Callable:
    """Wrap a CPU-compiled graph so it takes and returns neuron tensors, zero-copy; ``leading``
    (the lifted tensor attributes) go before the caller's arguments on every call."""
    leading = tuple(leading)

    def call(*args):
        if leading:
            args = (*leading, *args)
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        tensors = [args[i] for i in positions]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            enter, leave = ops._enter_compiled_call_differentiable, ops._exit_compiled_call_differentiable
        else:
            enter, leave = ops._enter_compiled_call, ops._exit_compiled_call
        if len(positions) == len(args):  # the usual graph: tensors in, a list/tuple of tensors out
            outputs = _call(compiled, enter(tensors))
            if type(outputs) in (list, tuple) and all(isinstance(o, torch.Tensor) for o in outputs):
                return type(outputs)(leave(list(outputs)))
            flat, spec = torch.utils._pytree.tree_flatten(outputs)
        else:
            flat, spec = _run(compiled, args, positions, enter(tensors))
        slots = [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor)]
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
