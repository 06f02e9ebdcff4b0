"""The runtime of compiled graphs: a CPU-compiled graph run on neuron tensors' own bytes.

Neuron inputs are passed as CPU aliases of the same bytes and the outputs come back as neuron
tensors without a copy (``_enter/_exit_compiled_call`` in csrc/compiled_calls.cpp). When
gradients flow, an autograd.Function bridges neuron autograd to the CPU graph's: its backward
runs the compiled backward on CPU aliases of the incoming gradients.
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


class _GradBridge(torch.autograd.Function):
    """Neuron autograd around a CPU-compiled graph: forward runs it on CPU aliases with grad
    enabled; backward differentiates the CPU outputs and adopts the input gradients."""

    @staticmethod
    def forward(ctx, compiled, args, positions, holder, *tensors):
        aliases = ops._enter_compiled_call(list(tensors))
        for t, alias in zip(tensors, aliases):
            if t.requires_grad:
                alias.requires_grad_(True)
        with torch.enable_grad():
            flat, spec = _run(compiled, args, positions, aliases)
        slots = [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor)]
        cpu_outputs = [flat[i] for i in slots]
        mapped = ops._exit_compiled_call(cpu_outputs)
        ctx.cpu_inputs = [a for t, a in zip(tensors, aliases) if t.requires_grad]
        ctx.needs = [t.requires_grad for t in tensors]
        ctx.cpu_outputs = cpu_outputs
        ctx.device = next((t.device for t in tensors if t.device.type == BACKEND_NAME), None)
        ctx.mark_non_differentiable(*[m for m, o in zip(mapped, cpu_outputs) if not o.requires_grad])
        holder.extend([flat, slots, spec])
        return tuple(mapped)

    @staticmethod
    @torch._disable_dynamo  # called by autograd from user code Dynamo may be tracing (loss.backward() in a compiled step)
    def backward(ctx, *grads):
        pairs = [(o, g) for o, g in zip(ctx.cpu_outputs, grads) if o.requires_grad and g is not None]
        grad_aliases = ops._enter_compiled_call([g for _, g in pairs])
        ops._exit_compiled_call([])
        cpu_grads = torch.autograd.grad([o for o, _ in pairs], ctx.cpu_inputs, grad_aliases, allow_unused=True)
        with torch.neuron.device(ctx.device):
            ops._enter_compiled_call([])
            present = [g for g in cpu_grads if g is not None]
            adopted = iter(ops._exit_compiled_call(present))
        by_input = iter(None if g is None else next(adopted) for g in cpu_grads)
        return (None, None, None, None, *[next(by_input) if need else None for need in ctx.needs])


def run_graph_on_neuron(compiled: Callable, leading: Sequence[torch.Tensor] = ()) -> Callable:
    """Wrap a CPU-compiled graph so it takes and returns neuron tensors, zero-copy; ``leading``
    (the lifted tensor attributes) go before the caller's arguments on every call."""
    leading = tuple(leading)
    enter, leave = ops._enter_compiled_call, ops._exit_compiled_call

    def call(*args):
        if leading:
            args = (*leading, *args)
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        tensors = [args[i] for i in positions]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            holder: list = []
            mapped = _GradBridge.apply(compiled, args, positions, holder, *tensors)
            flat, slots, spec = holder
            return _map_back(flat, slots, mapped, spec)
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
