"""The decompositions applied while AOTAutograd traces, before the graph is lowered to StableHLO:
TorchNeuron's compile decomposition table (``get_compile_decomposition_table`` in its
``neuron_dynamo_backend/decompositions.py``), mirrored, and what stands in for its private pipeline.

- :data:`STOCK_DECOMPOSITIONS`: TorchNeuron's selection from torch's own decompositions, by name.
- :data:`TORCHNEURON_DECOMPOSITIONS`: the entries TorchNeuron writes itself, each written here from
  the operator's mathematics (:mod:`.own_decompositions`). Attention, which TorchNeuron may route to
  NKI flash kernels on Trainium, takes its fallback: matmuls and a softmax.
- :data:`PRIVATE_PIPELINE_STAND_INS` and :data:`PRIVATE_PIPELINE_OWN`: ops that TorchNeuron's private
  torch-mlir pipeline (``torch-raw-to-neuron-backend-pipeline``, not public) must legalize, since
  TorchNeuron trains the modules that use them and stock torch-mlir does not lower them (pooling and
  padding backwards, common losses and activations). torch's decomposition where it has one, ours
  from the mathematics where it has none. Which op is which is in docs/compiled-coverage.md.
- foreach ops (``torch._foreach_add`` and the rest, which optimizers use) as one op per tensor, as
  TorchNeuron's own eager foreach kernels are written (``python_ops/torch_mlir/ops/foreach_ops.py``);
  stock torch-mlir legalizes none of them (:func:`foreach_as_loops`).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from torch_neuronx.neuron_dynamo_backend.faithful import own_decompositions as own
from torch_neuronx.neuron_dynamo_backend.faithful.special_functions import SPECIAL_FUNCTIONS

aten = torch.ops.aten

# The commit of TorchNeuron's source these tables were read from.
TORCHNEURON_COMMIT = "98154b867aa24562a3213e520d9ad7fd41032291"

# TorchNeuron's selection from torch's decomposition table, in its order (get_decompositions([...])).
STOCK_DECOMPOSITIONS = (
    "logsumexp", "squeeze.dims", "binary_cross_entropy", "native_batch_norm_backward", "nansum", "addr",
    "_unsafe_index", "_unsafe_index_put", "split", "split_with_sizes", "unbind", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "embedding", "native_layer_norm_backward", "nll_loss_backward", "clamp_min", "clamp_max", "linear_backward",
    "_fused_rms_norm", "_fused_rms_norm_backward", "fill.Scalar", "fill.Tensor", "index_add",
    "native_dropout_backward", "gelu_backward", "threshold_backward", "_log_softmax_backward_data",
    "_softmax_backward_data", "select_backward", "slice_backward", "softplus_backward", "index_select_backward",
    "col2im", "lerp", "elu", "elu_backward", "silu",
)

# TorchNeuron's own entries (its register_decomposition calls, and index_put, compile only): ours.
TORCHNEURON_DECOMPOSITIONS = {
    aten.as_strided.default: own.as_strided,
    aten.topk.default: own.topk,
    aten._scaled_dot_product_fused_attention_overrideable.default: own.attention_forward,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default: own.attention_backward,
    aten.scalar_tensor.default: own.scalar_tensor,
    aten.index_copy.default: own.index_copy,
    aten.nonzero_static.default: own.nonzero_static,
    aten.linalg_vector_norm.default: own.linalg_vector_norm,
    aten.index_put.default: own.index_put,
    aten.sigmoid_backward.default: own.sigmoid_backward,
    aten.silu_backward.default: own.silu_backward,
    aten.embedding_dense_backward.default: own.embedding_dense_backward,
    aten.linear_backward.default: own.linear_backward,
    aten._foreach_pow.Scalar: own.foreach_pow_scalar,
    aten.__rshift__.Scalar: own.rshift_scalar,
    aten.as_strided_scatter.default: own.as_strided_scatter,
    aten._grouped_mm.default: own.grouped_mm,
    aten.convolution_backward.default: own.convolution_backward,
    aten.value_selecting_reduction_backward.default: own.value_selecting_reduction_backward,
    aten.histc.default: own.histc,
    aten.argsort.default: own.argsort,
    aten.argsort.stable: own.argsort,
}

PRIVATE_PIPELINE_STAND_INS = (
    "nll_loss_forward", "leaky_relu_backward", "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward",
    "huber_loss", "huber_loss_backward", "binary_cross_entropy_backward", "xlogy.Tensor", "mish_backward",
    "hardswish_backward", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit", "native_group_norm_backward", "_unsafe_masked_index_put_accumulate",
    "max_pool2d_with_indices_backward", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "soft_margin_loss", "soft_margin_loss_backward", "log_sigmoid_forward",
    "log_sigmoid_backward", "nll_loss2d_forward", "nll_loss2d_backward", "glu_backward", "hardtanh_backward",
    "_prelu_kernel", "_prelu_kernel_backward", "unsafe_split.Tensor", "reflection_pad1d_backward",
    "reflection_pad2d_backward", "reflection_pad3d_backward", "addmv", "vdot", "block_diag", "cumprod",
    "diag_embed", "diagonal_copy", "alias_copy", "expand_copy",
    "index_fill", "std_mean.correction", "linspace.Tensor_Tensor", "logspace",
    "isin", "slice_scatter",
    # torch's composite definitions of ops outside the core ATen opset, and copying views
    "rsub", "_batch_norm_with_update_functional", "_chunk_cat", "_upsample_bilinear2d_aa", "as_strided_copy",
    "dist", "hardsigmoid_backward", "im2col", "logit_backward", "max_unpool2d",
    "max_unpool3d", "narrow_copy", "permute_copy", "sinc", "special_entr", "special_xlog1py",
    "split_with_sizes_copy", "squeeze_copy", "t_copy", "take", "transpose_copy", "unbind_copy", "unfold",
    "unfold_copy", "unsqueeze_copy", "view_copy", "mvlgamma", "norm", "unfold_backward",
    "empty_like",
)
PRIVATE_PIPELINE_OWN = {
    **{getattr(aten, f"avg_pool{n}d").default: functools.partial(own.avg_pool, spatial=n) for n in (2, 3)},
    **{getattr(aten, f"avg_pool{n}d_backward").default: functools.partial(own.avg_pool_backward, spatial=n)
       for n in (2, 3)},
    aten._adaptive_avg_pool2d.default: own.adaptive_avg_pool,
    aten._adaptive_avg_pool3d.default: own.adaptive_avg_pool,
    **{getattr(aten, f"_adaptive_avg_pool{n}d_backward").default:
       functools.partial(own.adaptive_avg_pool_backward, spatial=n) for n in (2, 3)},
    aten.max_pool3d_with_indices_backward.default: functools.partial(own.max_pool_backward, spatial=3),
    **{getattr(aten, f"adaptive_max_pool{n}d_backward").default:
       functools.partial(own.adaptive_max_pool_backward, spatial=n) for n in (2, 3)},
    **{getattr(aten, f"replication_pad{n}d_backward").default: own.replication_pad_backward for n in (1, 2, 3)},
    aten._pad_circular.default: own.pad_circular,
    aten.adaptive_max_pool2d.default: own.adaptive_max_pool,
    aten.adaptive_max_pool3d.default: own.adaptive_max_pool,
    aten._unsafe_masked_index.default: own.unsafe_masked_index,
    aten.empty.memory_format: own.empty_as_zeros,
    aten.new_empty.default: own.new_empty_as_zeros,
    aten.empty_strided.default: own.empty_strided_as_zeros,
    aten.empty_permuted.default: own.empty_permuted_as_zeros,
    aten.new_empty_strided.default: own.new_empty_strided_as_zeros,
    aten._efficientzerotensor.default: own.zero_tensor,
    aten.scatter_reduce.two: own.scatter_reduce,
    aten.index_reduce.default: own.index_reduce,
    aten.put.default: own.put,
    aten.diagonal.default: own.diagonal,
    aten.trace.default: own.trace,
    torch.ops.prims.prod.default: own.prims_prod,
    aten._pdist_backward.default: own.pdist_backward,
    aten._cdist_backward.default: own.cdist_backward,
    aten.cummax.default: own.cummax,
    aten.cummin.default: own.cummin,
    aten.frexp.Tensor: own.frexp,
    aten._upsample_bilinear2d_aa.default: own.upsample_bilinear2d_aa,
    aten._upsample_bilinear2d_aa_backward.default: own.upsample_bilinear2d_aa_backward,
    aten.amax.default: own.reduction_of_a_scalar,
    aten.amin.default: own.reduction_of_a_scalar,
    aten.sum.dim_IntList: own.reduction_of_a_scalar,
    aten.argmax.default: own.arg_of_a_scalar,
    aten.argmin.default: own.arg_of_a_scalar,
    aten.scatter.src: own.scatter_of_a_scalar,
    aten.masked_scatter_backward.default: own.masked_scatter_backward,
    aten.searchsorted.Tensor: own.searchsorted,
    aten.searchsorted.Scalar: own.searchsorted,
    aten.kthvalue.default: own.kthvalue,
    aten.median.default: own.median,
    aten.median.dim: own.median_dim,
    aten.nanmedian.default: own.nanmedian,
    aten.nanmedian.dim: own.nanmedian_dim,
    aten._cdist_forward.default: own.cdist,
    aten._pdist_forward.default: own.pdist,
    aten.angle.default: own.angle,
    aten.hypot.default: own.hypot,
    aten.diagonal_scatter.default: own.diagonal_scatter,
    aten.diagonal_backward.default: own.diagonal_backward,
    aten.mode.default: own.mode,
    aten.histogram.bin_ct: own.histogram,
    aten.histogram.bins_tensor: own.histogram,
    aten._histogramdd_bin_edges.default: own.histogramdd_bin_edges,
    aten._histogramdd_from_bin_cts.default: own.histogramdd_from_bin_cts,
    aten._histogramdd_from_bin_tensors.default: own.histogramdd_from_bin_tensors,
    aten.segment_reduce.default: own.segment_reduce,
    aten._segment_reduce_backward.default: own.segment_reduce_backward,
    aten._embedding_bag.default: own.embedding_bag,
    aten._embedding_bag_forward_only.default: own.embedding_bag,
    aten._embedding_bag_backward.default: own.embedding_bag_backward,
    aten._embedding_bag_per_sample_weights_backward.default: own.embedding_bag_per_sample_weights_backward,
    aten.embedding_renorm.default: own.embedding_renorm,
    aten.grid_sampler_2d.default: own.grid_sampler,
    aten.grid_sampler_2d_backward.default: own.grid_sampler_backward,
    aten.grid_sampler_3d.default: own.grid_sampler,
    aten.grid_sampler_3d_backward.default: own.grid_sampler_backward,
}


@contextlib.contextmanager
def attention_as_math():
    """SDPA's math backend, for the calls TorchNeuron does not send to its fused attention (see
    :func:`attention_as_on_neuron`): traced for CPU, SDPA would pick CPU's flash kernel, whose
    backward nothing lowers."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


def _attention_on_neuron(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """SDPA as it dispatches on a NeuronCore: TorchNeuron's backend choice (its
    ``_fused_sdp_choice`` for PrivateUse1) takes the fused overrideable op for 4-D query, key and
    value, which its decomposition (ours: :func:`.own_decompositions.attention_forward`, and the
    backward) turns into matmuls and a softmax by the log-sum-exp. With dropout, the math backend."""
    if query.dim() == key.dim() == value.dim() == 4 and dropout_p == 0.0:
        return aten._scaled_dot_product_fused_attention_overrideable(query, key, value, attn_mask, dropout_p,
                                                                     is_causal, False, scale=scale)[0]
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                            scale=scale, enable_gqa=enable_gqa)


def attention_as_on_neuron(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` (Dynamo's graph, modified in place) with each SDPA call made as on a NeuronCore."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (torch._C._nn.scaled_dot_product_attention,
                                                          torch.nn.functional.scaled_dot_product_attention):
            node.target = _attention_on_neuron
    gm.recompile()
    return gm


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


def _overloads(names) -> list:
    ops = []
    for name in names:
        base, _, overload = name.partition(".")
        packet = getattr(aten, base)
        ops.append(getattr(packet, overload) if overload else packet)
    return ops


@functools.cache
def decomposition_table() -> dict:
    from torch._decomp import get_decompositions

    return {**foreach_as_loops(), **get_decompositions(_overloads((*STOCK_DECOMPOSITIONS, *PRIVATE_PIPELINE_STAND_INS))),
            **SPECIAL_FUNCTIONS, **PRIVATE_PIPELINE_OWN, **TORCHNEURON_DECOMPOSITIONS}
