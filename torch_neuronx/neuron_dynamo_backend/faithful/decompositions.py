"""The decompositions applied while AOTAutograd traces, before the graph is lowered to StableHLO.

Three groups, and attention:
- TorchNeuron's own selection from torch's stock decompositions, by name;
- stand-ins for TorchNeuron's private torch-mlir pipeline (``torch-raw-to-neuron-backend-pipeline``,
  not public), which legalizes ops stock torch-mlir does not: common losses, activations and norms
  in training. Without them stock torch-mlir fails on them, crashes (``nll_loss_forward``) or
  computes wrong gradients (``leaky_relu_backward``), where Trainium trains them. torch's stock
  decompositions stand in: the same math;
- attention, which TorchNeuron decomposes itself, traced with SDPA's math backend
  (:func:`attention_as_math`);
- foreach ops (``torch._foreach_add`` and the rest, which optimizers use) as one op per tensor, as
  TorchNeuron's own eager foreach kernels are written (``python_ops/torch_mlir/ops/foreach_ops.py``);
  stock torch-mlir legalizes none of them (:func:`foreach_as_loops`).

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


# Foreach ops whose per-tensor op is not the op of the same name.
_FOREACH_SINGLE = {"maximum.Scalar": "clamp_min", "maximum.ScalarList": "clamp_min",
                   "minimum.Scalar": "clamp_max", "minimum.ScalarList": "clamp_max"}


def _foreach_loop(overload: torch._ops.OpOverload):
    """``overload`` (``aten._foreach_X.Y``) as a list of per-tensor ops: list arguments (tensors or
    numbers) are taken element by element, other arguments as they are."""
    aten = torch.ops.aten
    name = overload._schema.name.split("::")[1].removeprefix("_foreach_")
    key = f"{name}.{overload._overloadname}"
    listed = {argument.name for argument in overload._schema.arguments if isinstance(argument.type, torch.ListType)}
    positions = [argument.name for argument in overload._schema.arguments]

    def single(*args, **kwargs):
        if name in ("addcmul", "addcdiv"):  # value: keyword-only in the single op
            self, first, second, *value = args
            value = value[0] if value else kwargs.get("value", 1)
            if overload._overloadname == "Tensor":  # scalars: a tensor, one element each
                return self + value * (first * second if name == "addcmul" else first / second)
            return getattr(aten, name)(self, first, second, value=value)
        if name == "norm":
            return aten.linalg_vector_norm(args[0], *args[1:2], dtype=kwargs.get("dtype", None))
        if name == "powsum":
            return aten.sum(aten.pow(aten.abs(args[0]), args[1] if len(args) > 1 else 2))
        return getattr(aten, _FOREACH_SINGLE.get(key, name))(*args, **kwargs)

    def loop(*args, **kwargs):
        names = positions[:len(args)]
        count = len(next(v for n, v in [*zip(names, args), *kwargs.items()] if n in listed))
        results = []
        for i in range(count):
            element_args = [v[i] if n in listed else v for n, v in zip(names, args)]
            if name in ("addcmul", "addcdiv") and overload._overloadname == "Tensor":
                element_args[3] = element_args[3][i]
            element_kwargs = {n: v[i] if n in listed else v for n, v in kwargs.items()}
            results.append(single(*element_args, **element_kwargs))
        return results

    return loop


def foreach_as_loops() -> dict:
    """Every functional ``aten._foreach_*`` overload, as one op per tensor."""
    table = {}
    for schema in torch._C._jit_get_all_schemas():
        op, overload = schema.name, schema.overload_name
        if not op.startswith("aten::_foreach_") or op.endswith("_") or overload.endswith("out"):
            continue
        packet = getattr(torch.ops.aten, op.split("::")[1])
        target = getattr(packet, overload or "default")
        table[target] = _foreach_loop(target)
    return table


@functools.cache
def decomposition_table() -> dict:
    from torch._decomp import get_decompositions

    ops = []
    for name in (*STOCK_DECOMPOSITIONS, *PRIVATE_PIPELINE_STAND_INS):
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base)
        ops.append(getattr(packet, overload) if overload else packet)
    return {**foreach_as_loops(), **get_decompositions(ops)}
