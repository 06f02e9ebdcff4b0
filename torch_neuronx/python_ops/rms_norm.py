"""``rms_norm`` on neuron as TorchNeuron registers it (its ``python_ops/rms_norm.py``), with CPU's values.

TorchNeuron registers ``rms_norm`` itself: a half-precision input with a weight of another dtype is
computed in float32 and cast back, and every call goes through its ``_fused_rms_norm`` kernel, whose
backward is its ``_fused_rms_norm_backward`` kernel. So op tracking and the readiness report see one
``_fused_rms_norm`` call forward and one ``_fused_rms_norm_backward`` call backward, with any dtypes.

The values are CPU's, bit for bit: ``_fused_rms_norm`` runs PyTorch's own composite (the ops CPU's
``rms_norm`` runs, in the same order and dtypes, the float32 casts included), and its gradients are
autograd through those very ops, recorded while the forward ran (no recomputation), as on CPU. Each
is tracked as one named op (``csrc/named_ops.cpp``: counted once, its parts observed). A second
backward (``retain_graph``) or a backward of the backward (``create_graph``) runs the composite again
on the inputs themselves: the first gradients are still CPU's bit for bit, a backward of the backward
is CPU's to rounding (its contributions summed in another order). Traced or wrapped tensors
(``torch.compile``, DTensor) take the composite as it is, as any device's would.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils import _pytree as pytree

from torch_neuronx.runtime import ops

_aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_library: torch.library.Library | None = None


@contextlib.contextmanager
def _named(name: str):
    ops._named_scope_enter(name)
    try:
        yield
    finally:
        ops._named_scope_exit()


def _plain(*tensors) -> bool:
    return all(t is None or type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)


def _composite(input, normalized_shape, weight, eps):
    return _aten._fused_rms_norm.default.decompose(input, normalized_shape, weight, eps)


class _FusedRmsNorm(torch.autograd.Function):
    """Forward: the composite, its graph recorded on detached inputs; backward: that graph's
    gradients, as one ``_fused_rms_norm_backward`` call. A second backward (``retain_graph``) or a
    differentiable one (``create_graph``) runs the composite again on the inputs themselves."""

    @staticmethod
    def forward(ctx, input, normalized_shape, weight, eps):
        ctx.arguments = (normalized_shape, eps)
        ctx.set_materialize_grads(False)  # rstd's gradient, never used: no zeros made for it
        ctx.save_for_backward(input, weight)
        inner = [None if t is None else t.detach().requires_grad_(needs)
                 for t, needs in ((input, ctx.needs_input_grad[0]), (weight, ctx.needs_input_grad[2]))]
        with torch.enable_grad(), _named("_fused_rms_norm"):
            output, rstd = _composite(inner[0], normalized_shape, inner[1], eps)
        ctx.graph = (output, inner)
        ctx.mark_non_differentiable(rstd)
        return output.detach(), rstd.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_rstd):
        if grad_output is None:
            return None, None, None, None
        wanted = (ctx.needs_input_grad[0], ctx.needs_input_grad[2])
        with _named("_fused_rms_norm_backward"):
            if ctx.graph is not None and not torch.is_grad_enabled():
                output, inner = ctx.graph
                ctx.graph = None  # its buffers go now, as autograd frees a graph after its backward
            else:
                inner = list(ctx.saved_tensors)
                with torch.enable_grad():
                    output = _composite(inner[0], ctx.arguments[0], inner[1], ctx.arguments[1])[0]
            leaves = [t for t, needs in zip(inner, wanted) if needs]
            grads = iter(torch.autograd.grad(output, leaves, grad_output, create_graph=torch.is_grad_enabled(),
                                             allow_unused=True))
        return (next(grads) if wanted[0] else None, None, next(grads) if wanted[1] else None, None)


def _fused_rms_norm_autograd(input, normalized_shape, weight=None, eps=None):
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight))
    if not _plain(input, weight):  # traced or wrapped: the composite, as for any device
        return _composite(input, normalized_shape, weight, eps)
    if not needs_grad:
        return _fused_rms_norm(input, normalized_shape, weight, eps)
    return _FusedRmsNorm.apply(input, normalized_shape, weight, eps)


def _fused_rms_norm(input, normalized_shape, weight=None, eps=None):
    if not _plain(input, weight):
        return _composite(input, normalized_shape, weight, eps)
    with torch.no_grad(), _named("_fused_rms_norm"):
        return _composite(input, normalized_shape, weight, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """TorchNeuron's rms_norm: float32 for a half input beside a weight of another dtype."""
    if not _plain(input, weight) or any(isinstance(x, torch.SymInt) for x in pytree.tree_leaves(normalized_shape)):
        return _aten.rms_norm.default.decompose(input, normalized_shape, weight, eps)
    original = input.dtype
    if weight is not None and weight.dtype != input.dtype and input.dtype in _HALF:
        input, weight = input.to(torch.float32), weight.to(torch.float32)
    return _aten._fused_rms_norm(input, normalized_shape, weight, eps)[0].to(original)


def install() -> None:
    """Register the kernels for neuron (once per process), before the named composites are read."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
        for name, kernel, key in (("rms_norm", rms_norm, "AutogradPrivateUse1"), ("rms_norm", rms_norm, "PrivateUse1"),
                                  ("_fused_rms_norm", _fused_rms_norm_autograd, "AutogradPrivateUse1"),
                                  ("_fused_rms_norm", _fused_rms_norm, "PrivateUse1")):
            _library.impl(name, kernel, key)
