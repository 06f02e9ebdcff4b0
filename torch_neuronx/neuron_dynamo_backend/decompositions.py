"""The decompositions applied while AOTAutograd traces, before the graph is lowered to StableHLO.

Three groups, and attention:
- TorchNeuron's own selection from torch's stock decompositions, by name;
- stand-ins for TorchNeuron's private torch-mlir pipeline (``torch-raw-to-neuron-backend-pipeline``,
  not public), which legalizes ops stock torch-mlir does not: common losses, activations and norms
  in training. Without them stock torch-mlir fails on them, crashes (``nll_loss_forward``) or
  computes wrong gradients (``leaky_relu_backward``), where Trainium trains them. torch's stock
  decompositions stand in: the same math;
- attention, which TorchNeuron decomposes itself, traced with SDPA's math backend
  (:func:`attention_as_math`).

TorchNeuron's other decompositions (as_strided, topk, linear_backward, convolution_backward, pooling
backward, ...) are not mirrored: a graph needing them fails here (convolution training does), and
fft and svdvals, which nothing decomposes, fail in both.
"""
from __future__ import annotations

import contextlib
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
PRIVATE_PIPELINE_STAND_INS = (
    "nll_loss_forward", "leaky_relu_backward", "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward",
    "huber_loss", "huber_loss_backward", "binary_cross_entropy_backward", "xlogy.Tensor", "mish_backward",
    "hardswish_backward", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit", "native_group_norm_backward", "embedding_dense_backward",
    "_unsafe_masked_index_put_accumulate", "max_pool2d_with_indices_backward",
)


@contextlib.contextmanager
def attention_as_math():
    """Attention as TorchNeuron lowers it (its own decomposition of PrivateUse1's fused attention,
    without its NKI kernels): matmuls and a softmax. The graph here is traced for CPU, where SDPA
    would pick CPU's flash kernel, whose backward nothing lowers; SDPA's math backend is the same
    decomposition, forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


@functools.cache
def decomposition_table() -> dict:
    from torch._decomp import get_decompositions

    ops = []
    for name in (*STOCK_DECOMPOSITIONS, *PRIVATE_PIPELINE_STAND_INS):
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base)
        ops.append(getattr(packet, overload) if overload else packet)
    return get_decompositions(ops)
