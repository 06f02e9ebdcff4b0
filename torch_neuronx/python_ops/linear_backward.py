"""``aten::linear_backward`` for neuron, as TorchNeuron's kernel computes it.

PyTorch has this op for MKLDNN tensors only (no CPU or composite kernel), so a call on neuron
tensors found no kernel. TorchNeuron registers one (its ``python_ops`` linear ops): the input's
gradient ``grad @ weight`` when ``output_mask[0]``; the weight's gradient (``grad``'s rows times the
input's, summed over the batch dimensions) and the bias's (``grad`` summed over them) both when
either is asked for, as PyTorch computes them together; ``None`` for what is not computed. Here it
runs on CPU aliases of the neuron bytes (``host_route``), with CPU's matmul.
"""
from __future__ import annotations

import torch

from torch_neuronx.python_ops.host_route import host_route

_library: torch.library.Library | None = None


def _on_host(input: torch.Tensor, grad_output: torch.Tensor, weight: torch.Tensor, output_mask):
    input_grad = grad_output @ weight if output_mask[0] else None
    weight_grad = bias_grad = None
    if output_mask[1] or output_mask[2]:
        rows = grad_output.reshape(-1, grad_output.shape[-1])
        weight_grad = rows.t() @ input.reshape(-1, input.shape[-1])
        bias_grad = rows.sum(0)
    return input_grad, weight_grad, bias_grad


def install() -> None:
    """Register the kernel for neuron (once per process)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("linear_backward", host_route(_on_host, "aten::linear_backward"), "PrivateUse1")
    _library = library
