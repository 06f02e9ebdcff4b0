"""The decompositions applied while AOTAutograd traces, before the graph is lowered to StableHLO:
TorchNeuron's compile decomposition table (``get_compile_decomposition_table`` in its
``neuron_dynamo_backend/decompositions.py``), mirrored, and what stands in for its private pipeline.

- :data:`STOCK_DECOMPOSITIONS`: TorchNeuron's selection from torch's own decompositions, by name.
- :data:`TORCHNEURON_DECOMPOSITIONS`: the entries TorchNeuron writes itself, each written here from
  the operator's mathematics, in this package's modules by subject (:mod:`.views`, :mod:`.sorting`,
  :mod:`.arithmetic`, :mod:`.attention`, :mod:`.convolution`, :mod:`.reductions`,
  :mod:`.elementwise`, :mod:`.sampling`). Attention, which TorchNeuron may route to
  NKI flash kernels on Trainium, takes its fallback: matmuls and a softmax.
- :data:`PRIVATE_PIPELINE_STAND_INS` and :data:`PRIVATE_PIPELINE_OWN`: ops that TorchNeuron's private
  torch-mlir pipeline (``torch-raw-to-neuron-backend-pipeline``, not public) must legalize, since
  TorchNeuron trains the modules that use them and stock torch-mlir does not lower them (pooling and
  padding backwards, common losses and activations). torch's decomposition where it has one, ours
  from the mathematics where it has none. Which op is which is in docs/compiled-coverage.md.
- :data:`SPECIAL_FUNCTIONS`: the special functions (gamma family, error functions, incomplete gamma,
  Bessel functions, Chebyshev polynomials; :mod:`.special_gamma`, :mod:`.special_normal`,
  :mod:`.special_bessel`), which torch-mlir lowers none of, as elementary ops.
- foreach ops (``torch._foreach_add`` and the rest, which optimizers use) as one op per tensor, as
  TorchNeuron's own eager foreach kernels are written (``python_ops/torch_mlir/ops/foreach_ops.py``);
  stock torch-mlir legalizes none of them (:func:`foreach_as_loops`).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from torch_neuronx.neuron_dynamo_backend.faithful.decompositions import (
    arithmetic,
    attention,
    convolution,
    elementwise,
    reductions,
    sampling,
    sorting,
    special_bessel,
    special_gamma,
    special_normal,
    views,
)

aten = torch.ops.aten

# The special functions, none of which torch-mlir lowers, each as elementary ops.
SPECIAL_FUNCTIONS = {
    aten.lgamma.default: special_gamma.lgamma,
    aten.digamma.default: special_gamma.digamma,
    aten.polygamma.default: special_gamma.polygamma,
    aten.special_zeta.default: special_gamma.special_zeta,
    aten.special_zeta.self_scalar: special_gamma.special_zeta,
    aten.special_zeta.other_scalar: special_gamma.special_zeta,
    aten.erfinv.default: special_normal.erfinv,
    aten.erfc.default: special_normal.erfc,
    aten.special_erfcx.default: special_normal.special_erfcx,
    aten.special_ndtri.default: special_normal.special_ndtri,
    aten.special_log_ndtr.default: special_normal.special_log_ndtr,
    aten.nextafter.default: special_normal.nextafter,
    aten.igamma.default: special_gamma.igamma,
    aten.igammac.default: special_gamma.igammac,
    aten.special_i0e.default: special_bessel.special_i0e,
    aten.special_i1.default: special_bessel.special_i1,
    aten.special_i1e.default: special_bessel.special_i1e,
    aten.special_modified_bessel_i0.default: special_bessel.special_modified_bessel_i0,
    aten.i0.default: special_bessel.special_modified_bessel_i0,
    aten.special_modified_bessel_i1.default: special_bessel.special_i1,
    aten.special_modified_bessel_k0.default: special_bessel.special_modified_bessel_k0,
    aten.special_modified_bessel_k1.default: special_bessel.special_modified_bessel_k1,
    aten.special_scaled_modified_bessel_k0.default: special_bessel.special_scaled_modified_bessel_k0,
    aten.special_scaled_modified_bessel_k1.default: special_bessel.special_scaled_modified_bessel_k1,
    aten.special_bessel_j0.default: special_bessel.special_bessel_j0,
    aten.special_bessel_j1.default: special_bessel.special_bessel_j1,
    aten.special_bessel_y0.default: special_bessel.special_bessel_y0,
    aten.special_bessel_y1.default: special_bessel.special_bessel_y1,
    aten.special_spherical_bessel_j0.default: special_bessel.special_spherical_bessel_j0,
    aten.special_airy_ai.default: special_bessel.special_airy_ai,
}
for _name, _function in special_bessel.CHEBYSHEV.items():
    for _overload in ("default", "x_scalar", "n_scalar"):
        SPECIAL_FUNCTIONS[getattr(getattr(aten, "special_" + _name), _overload)] = _function

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
    aten.as_strided.default: views.as_strided,
    aten.topk.default: sorting.topk,
    aten._scaled_dot_product_fused_attention_overrideable.default: attention.attention_forward,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default: attention.attention_backward,
    aten.scalar_tensor.default: arithmetic.scalar_tensor,
    aten.index_copy.default: views.index_copy,
    aten.nonzero_static.default: views.nonzero_static,
    aten.linalg_vector_norm.default: arithmetic.linalg_vector_norm,
    aten.index_put.default: views.index_put,
    aten.sigmoid_backward.default: arithmetic.sigmoid_backward,
    aten.silu_backward.default: arithmetic.silu_backward,
    aten.embedding_dense_backward.default: views.embedding_dense_backward,
    aten.linear_backward.default: arithmetic.linear_backward,
    aten._foreach_pow.Scalar: arithmetic.foreach_pow_scalar,
    aten.__rshift__.Scalar: arithmetic.rshift_scalar,
    aten.as_strided_scatter.default: views.as_strided_scatter,
    aten._grouped_mm.default: arithmetic.grouped_mm,
    aten.convolution_backward.default: convolution.convolution_backward,
    aten.value_selecting_reduction_backward.default: views.value_selecting_reduction_backward,
    aten.histc.default: sorting.histc,
    aten.argsort.default: sorting.argsort,
    aten.argsort.stable: sorting.argsort,
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
    **{getattr(aten, f"avg_pool{n}d").default: functools.partial(convolution.avg_pool, spatial=n) for n in (2, 3)},
    **{getattr(aten, f"avg_pool{n}d_backward").default: functools.partial(convolution.avg_pool_backward, spatial=n)
       for n in (2, 3)},
    aten._adaptive_avg_pool2d.default: convolution.adaptive_avg_pool,
    aten._adaptive_avg_pool3d.default: convolution.adaptive_avg_pool,
    **{getattr(aten, f"_adaptive_avg_pool{n}d_backward").default:
       functools.partial(convolution.adaptive_avg_pool_backward, spatial=n) for n in (2, 3)},
    aten.max_pool3d_with_indices_backward.default: functools.partial(convolution.max_pool_backward, spatial=3),
    **{getattr(aten, f"adaptive_max_pool{n}d_backward").default:
       functools.partial(convolution.adaptive_max_pool_backward, spatial=n) for n in (2, 3)},
    **{getattr(aten, f"replication_pad{n}d_backward").default: convolution.replication_pad_backward for n in (1, 2, 3)},
    aten._pad_circular.default: convolution.pad_circular,
    aten.adaptive_max_pool2d.default: convolution.adaptive_max_pool,
    aten.adaptive_max_pool3d.default: convolution.adaptive_max_pool,
    aten._unsafe_masked_index.default: views.unsafe_masked_index,
    aten.empty.memory_format: views.empty_as_zeros,
    aten.new_empty.default: views.new_empty_as_zeros,
    aten.empty_strided.default: views.empty_strided_as_zeros,
    aten.empty_permuted.default: elementwise.empty_permuted_as_zeros,
    aten.new_empty_strided.default: elementwise.new_empty_strided_as_zeros,
    aten._efficientzerotensor.default: elementwise.zero_tensor,
    aten.scatter_reduce.two: reductions.scatter_reduce,
    aten.index_reduce.default: reductions.index_reduce,
    aten.put.default: reductions.put,
    aten.diagonal.default: elementwise.diagonal,
    aten.trace.default: elementwise.trace,
    torch.ops.prims.prod.default: reductions.prims_prod,
    aten._pdist_backward.default: elementwise.pdist_backward,
    aten._cdist_backward.default: elementwise.cdist_backward,
    aten.cummax.default: elementwise.cummax,
    aten.cummin.default: elementwise.cummin,
    aten.frexp.Tensor: sampling.frexp,
    aten._upsample_bilinear2d_aa.default: sampling.upsample_bilinear2d_aa,
    aten._upsample_bilinear2d_aa_backward.default: sampling.upsample_bilinear2d_aa_backward,
    aten.amax.default: reductions.reduction_of_a_scalar,
    aten.amin.default: reductions.reduction_of_a_scalar,
    aten.sum.dim_IntList: reductions.reduction_of_a_scalar,
    aten.argmax.default: reductions.arg_of_a_scalar,
    aten.argmin.default: reductions.arg_of_a_scalar,
    aten.scatter.src: reductions.scatter_of_a_scalar,
    aten.masked_scatter_backward.default: reductions.masked_scatter_backward,
    aten.searchsorted.Tensor: reductions.searchsorted,
    aten.searchsorted.Scalar: reductions.searchsorted,
    aten.kthvalue.default: sorting.kthvalue,
    aten.median.default: sorting.median,
    aten.median.dim: sorting.median_dim,
    aten.nanmedian.default: sorting.nanmedian,
    aten.nanmedian.dim: sorting.nanmedian_dim,
    aten._cdist_forward.default: elementwise.cdist,
    aten._pdist_forward.default: elementwise.pdist,
    aten.angle.default: elementwise.angle,
    aten.hypot.default: elementwise.hypot,
    aten.diagonal_scatter.default: elementwise.diagonal_scatter,
    aten.diagonal_backward.default: elementwise.diagonal_backward,
    aten.mode.default: sorting.mode,
    aten.histogram.bin_ct: sorting.histogram,
    aten.histogram.bins_tensor: sorting.histogram,
    aten._histogramdd_bin_edges.default: sorting.histogramdd_bin_edges,
    aten._histogramdd_from_bin_cts.default: sorting.histogramdd_from_bin_cts,
    aten._histogramdd_from_bin_tensors.default: sorting.histogramdd_from_bin_tensors,
    aten.segment_reduce.default: reductions.segment_reduce,
    aten._segment_reduce_backward.default: reductions.segment_reduce_backward,
    aten._embedding_bag.default: views.embedding_bag,
    aten._embedding_bag_forward_only.default: views.embedding_bag,
    aten._embedding_bag_backward.default: views.embedding_bag_backward,
    aten._embedding_bag_per_sample_weights_backward.default: views.embedding_bag_per_sample_weights_backward,
    aten.embedding_renorm.default: views.embedding_renorm,
    aten.grid_sampler_2d.default: sampling.grid_sampler,
    aten.grid_sampler_2d_backward.default: sampling.grid_sampler_backward,
    aten.grid_sampler_3d.default: sampling.grid_sampler,
    aten.grid_sampler_3d_backward.default: sampling.grid_sampler_backward,
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
    value, which its decomposition (ours: :func:`.attention.attention_forward`, and the
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
