"""The decompositions TorchNeuron's compiled path applies while AOTAutograd traces, before the
graph is lowered to StableHLO: the stock torch decompositions it selects, by name.

TorchNeuron adds decompositions of its own (as_strided, topk, attention, linear_backward,
convolution_backward, ...). Of those only attention has a counterpart here (below); for the rest,
torch-mlir lowers the aten ops they replace, so a graph lowers here where TorchNeuron's would,
while fft, nearest-neighbour interpolation and svdvals, which neither decomposes, fail in both.
"""
from __future__ import annotations

import functools

import torch

# TorchNeuron's selection from torch's decomposition table (its docs/decompositions.md and
# decompositions.py); sigmoid_backward and silu_backward, which it writes itself, have stock
# equivalents.
STOCK_DECOMPOSITIONS = (
    "logsumexp", "squeeze.dims", "binary_cross_entropy", "native_batch_norm_backward", "nansum", "addr",
    "_unsafe_index", "_unsafe_index_put", "split", "split_with_sizes", "unbind", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "embedding", "native_layer_norm_backward", "nll_loss_backward", "clamp_min", "clamp_max", "_fused_rms_norm",
    "_fused_rms_norm_backward", "fill.Scalar", "fill.Tensor", "index_add", "native_dropout_backward",
    "gelu_backward", "threshold_backward", "_log_softmax_backward_data", "_softmax_backward_data",
    "select_backward", "slice_backward", "softplus_backward", "col2im", "lerp", "elu", "elu_backward", "silu",
    "sigmoid_backward", "silu_backward",
)


# Attention as TorchNeuron lowers it: its own decomposition of PrivateUse1's fused attention into
# matmuls and a softmax (``_scaled_dot_product_fused_attention_overrideable``). The graph here is
# traced for CPU, where SDPA picks CPU's flash kernel instead; torch's decomposition of that kernel
# is the same math.
ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu",)


@functools.cache
def decomposition_table() -> dict:
    from torch._decomp import get_decompositions

    ops = [getattr(torch.ops.aten, name).default for name in ATTENTION]
    for name in STOCK_DECOMPOSITIONS:
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base)
        ops.append(getattr(packet, overload) if overload else packet)
    return get_decompositions(ops)
