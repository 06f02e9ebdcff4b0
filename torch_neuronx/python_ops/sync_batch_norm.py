"""The five kernels ``nn.SyncBatchNorm`` calls, for neuron: TorchNeuron's ``python_ops`` for them.

PyTorch has ``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt``,
``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt`` for CUDA only. TorchNeuron registers
them for neuron (its ``python_ops/torch_mlir/ops/normalization.py``, and the JAX twins in
``python_ops/jax/ops/batch_norm_*.py``); these compute what those compute, in the same order, on the
host: each runs on CPU aliases of the neuron tensors (no copies) and its results are adopted as
neuron tensors, so it is one op on neuron, as there.

Where TorchNeuron differs from CUDA, these do as TorchNeuron does:
- ``batch_norm_gather_stats_with_counts`` combines the ranks' statistics in float32, as the mean
  of the per-rank variances plus the spread of the means (CUDA merges them as Welford does; the
  result is equal to rounding), and leaves ``running_mean`` and ``running_var`` as they were:
  nn.SyncBatchNorm does not update its running statistics on Trainium (CUDA's kernel updates them in
  place). A rank whose count is 0 makes the variance NaN (TorchNeuron zeroes its invstd, then divides
  by it; CUDA skips the rank); nn.SyncBatchNorm drops such ranks before the call.
- ``batch_norm_backward_reduce`` returns all four results whatever ``input_g``, ``weight_g`` and
  ``bias_g`` ask for (CUDA leaves the ones not asked for undefined).
- Results keep the dtypes torch's type promotion gives (CUDA returns float32 statistics for
  float16 and bfloat16 inputs).
"""
from __future__ import annotations

import torch

from torch_neuronx.python_ops.host_route import run_on_host
from torch_neuronx.runtime import ops

_library: torch.library.Library | None = None


def _channels(input: torch.Tensor, *stats):
    """Per-channel tensors shaped to broadcast along ``input``'s dimension 1 (None stays None)."""
    shape = [1] * input.dim()
    shape[1] = -1
    return [None if s is None else s.reshape(shape) for s in stats]


def _reduced_dims(input: torch.Tensor) -> tuple[int, ...]:
    return tuple(d for d in range(input.dim()) if d != 1)


def stats(input, eps):
    dims = _reduced_dims(input)
    mean = input.mean(dim=dims)
    invstd = torch.rsqrt(input.var(dim=dims, unbiased=False) + eps)
    return mean, invstd


def gather_stats_with_counts(input, means, invstds, running_mean, running_var, momentum, eps, counts):
    del input, running_mean, running_var, momentum  # TorchNeuron's kernel reads none of them
    means, invstds, counts = means.float(), invstds.float(), counts.float()
    mask = counts > 0  # TorchNeuron's mask: a zero count zeroes the rank's invstd too (then 1/0: NaN)
    counts = counts * mask
    means = means * mask.unsqueeze(-1)
    invstds = invstds * mask.unsqueeze(-1)
    total = counts.sum()
    total = torch.where(total == 0, 1.0, total)
    mean = (means * counts.unsqueeze(-1)).sum(dim=0) / total
    variances = 1.0 / invstds**2 - eps
    var = (counts.unsqueeze(-1) * (variances + (means - mean) ** 2)).sum(dim=0) / total
    return mean, 1.0 / torch.sqrt(var + eps)


def elemt(input, weight, bias, mean, invstd, eps):
    del eps  # invstd has it
    mean, invstd, weight, bias = _channels(input, mean, invstd, weight, bias)
    out = (input - mean) * invstd
    return (out * (1.0 if weight is None else weight) + (0.0 if bias is None else bias),)


def backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    del weight, input_g, weight_g, bias_g  # all four results, always
    dims = _reduced_dims(input)
    mean, invstd = _channels(input, mean, invstd)
    xmu = input - mean
    sum_dy = grad_out.sum(dim=dims)
    sum_dy_xmu = (grad_out * xmu).sum(dim=dims)
    grad_weight = (grad_out * (xmu * invstd)).sum(dim=dims)
    return sum_dy, sum_dy_xmu, grad_weight, sum_dy.clone()


def backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    mean, invstd, weight, sum_dy, sum_dy_xmu = _channels(input, mean, invstd, weight, sum_dy, sum_dy_xmu)
    total = count.sum()  # the ranks' counts
    k = sum_dy_xmu * invstd * invstd / total
    grad_in = (grad_out - sum_dy / total - input.sub(mean) * k) * invstd
    return (grad_in * (1.0 if weight is None else weight),)


def _kernel(name: str, compute, single: bool):
    def kernel(*args):
        results = run_on_host(compute, args)
        ops._track_op(name, [], [])  # tracked under its name, as TorchNeuron's kernels are
        return results[0] if single else results
    return kernel


def _out_kernel(kernel, single: bool):
    """The ``.out`` overload: the results copied into the given tensors (resized when they differ)."""
    def out_kernel(*args, **outs):
        results = kernel(*args)
        targets = list(outs.values())
        with torch.no_grad():
            for target, result in zip(targets, (results,) if single else results):
                if target.shape != result.shape:
                    target.resize_(result.shape)
                target.copy_(result)
        return targets[0] if single else tuple(targets)
    return out_kernel


# name -> (computation, whether it returns one tensor)
KERNELS = {
    "batch_norm_stats": (stats, False),
    "batch_norm_gather_stats_with_counts": (gather_stats_with_counts, False),
    "batch_norm_elemt": (elemt, True),
    "batch_norm_backward_reduce": (backward_reduce, False),
    "batch_norm_backward_elemt": (backward_elemt, True),
}


def install() -> None:
    """Register the kernels (and their ``.out`` overloads) for neuron, once per process."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    for name, (compute, single) in KERNELS.items():
        kernel = _kernel(name, compute, single)
        library.impl(name, kernel, "PrivateUse1")
        if "out" in getattr(torch.ops.aten, name).overloads():
            library.impl(f"{name}.out", _out_kernel(kernel, single), "PrivateUse1")
    _library = library
