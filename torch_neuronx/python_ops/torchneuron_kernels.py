"""The aten ops TorchNeuron registers a neuron kernel for, by overload, read from its public source
(parmoham-aws/test-repo-parmoham at 98154b8, April 2026): the names its operation registries take
(``register_aten``, ``@neuron_op`` in ``torch_neuronx/python_ops``) and its C++ registrations
(``m.impl`` in ``torch_neuronx/csrc/core/NeuronBindings.cpp``). Its CPU fallback runs every other op.

Two readers: an op with no kernel there runs on TorchNeuron's CPU fallback (:func:`has_kernel`: the
readiness report's fallbacks, ``get_fallback_ops``); and the composites among them, which PyTorch
decomposes before a backend sees them (no CPU kernel: ``linear``, ``clone``, ``stack``, ...), are
tracked under their own name here, as TorchNeuron tracks and compiles them (:func:`named_composites`,
registered by ``csrc/named_ops.cpp``).
"""
from __future__ import annotations

import functools
import re

import torch

SOURCE = ("TorchNeuron's source at 98154b8 (April 2026): the ops its python_ops registries and "
          "NeuronBindings.cpp register for the neuron device")
# Not the overloads only its JAX registry adds (where.ScalarSelf, masked_fill.Scalar, pad, lerp, ...),
# nor registrations commented out (repeat_interleave.self_int): its tests are written for its
# torch-mlir registry, where those decompose (test_where asserts where.self for a scalar branch).

# base(overload overload ...) or base alone (its default overload); "default" names the default.
_LISTED = """
_conj _copy_from_and_resize _foreach_add(List List_out Scalar ScalarList ScalarList_out Scalar_out
Tensor Tensor_out) _foreach_add_(List Scalar ScalarList Tensor) _foreach_div(List List_out Scalar
ScalarList ScalarList_out Scalar_out Tensor Tensor_out) _foreach_div_(List Scalar ScalarList Tensor)
_foreach_mul(List List_out Scalar ScalarList ScalarList_out Scalar_out Tensor Tensor_out)
_foreach_mul_(List Scalar ScalarList Tensor) _foreach_norm(Scalar Scalar_out) _foreach_sub(List
List_out Scalar ScalarList ScalarList_out Scalar_out Tensor Tensor_out) _foreach_sub_(List Scalar
ScalarList Tensor) _fused_adamw_(default tensor_lr) _fused_rms_norm _fused_rms_norm_backward
_grouped_mm _has_compatible_shallow_copy_type _index_put_impl_ _local_scalar_dense
_log_softmax(default out) _log_softmax_backward_data(default out) _neg_view _reshape_alias
_softmax(default out) _softmax_backward_data(default out) _to_copy abs(default out) add(default
Tensor out) add_(Tensor) addcdiv(default out) addcmul(default out) addmm(default out) addmv(default
out) addmv_ adjoint alias all(default all_out out) amax(default out) amin(default out) any(default
all_out out) arange(default start_out) argsort(stable) as_strided atleast_2d(Sequence)
batch_norm_backward_elemt(default out) batch_norm_backward_reduce(default out)
batch_norm_elemt(default out) batch_norm_gather_stats_with_counts batch_norm_stats(default out)
bitwise_and(default Tensor_out out) bitwise_left_shift(Scalar_Tensor Scalar_Tensor_out Tensor
Tensor_Scalar Tensor_Scalar_out Tensor_out) bitwise_not(default Tensor_out out) bitwise_or(default
Tensor_out out) bitwise_right_shift(Scalar_Tensor Scalar_Tensor_out Tensor Tensor_Scalar
Tensor_Scalar_out Tensor_out) bitwise_xor(default Tensor_out out) bmm(default out) cat(default out)
ceil(default out) chunk clamp(default Tensor Tensor_out out) clamp_max(default Tensor Tensor_out
out) clamp_min(default Tensor Tensor_out out) clone conj constant_pad_nd contiguous convolution
convolution_backward copy_ cos(default out) cross_entropy_loss cumsum(default out) detach diagonal
div(default out out_mode) div_(Tensor) dot(default out) embedding embedding_dense_backward(default
out) empty(default memory_format) empty_strided eq(default Scalar_out Tensor_out) erf(default out)
erfinv(default out) exp(default out) expand expand_as eye(default m m_out out) fill_(default Scalar
Tensor) flatten flip(default out) floor_divide(default out) full(default out) gather(default out)
ge(default Scalar_out Tensor_out) gelu(default out) gelu_ gelu_backward(default grad_input)
gt(default Scalar_out Tensor_out) histc(default out) imag index(default Tensor Tensor_out)
index_add(default out) index_add_ index_copy(default out) index_copy_ index_select(default out)
index_select_backward isfinite isinf isnan isneginf(default out) le(default Scalar_out Tensor_out)
lerp(Scalar Scalar_out Tensor Tensor_out) lerp_(Scalar Tensor) linalg_vector_norm(default out)
linear linear_backward log(default out) log_softmax logical_and(default out) logical_not(default
out) logical_or(default out) logical_xor(default out) lt(default Scalar_out Tensor_out) mH mT
masked_fill masked_fill_(Scalar) masked_select(default Tensor_out out) max(default dim dim_max
unary_out) mean(default dim dtype_out out) min(default unary_out) mm(default out) moveaxis movedim
mul(Scalar Scalar_out Tensor out) mul_ mv(default out) narrow native_dropout native_dropout_backward
native_layer_norm(default out) native_layer_norm_backward(default out) ne(default Scalar_out
Tensor_out) neg(default out) neg_ new_empty nll_loss_backward(default grad_input)
nll_loss_forward(default output) nonzero(default out) nonzero_static(default out) one_hot
ones(default out) ones_like permute pow(default Scalar_out Tensor_Scalar_out Tensor_Tensor_out) real
reciprocal(default out) reciprocal_ record_stream reflection_pad1d reflection_pad2d reflection_pad3d
relu(default out) relu_ remainder(default Tensor_out) repeat repeat_interleave(Tensor)
replication_pad1d replication_pad2d(default out) replication_pad3d reshape reshape_as resize_
rsqrt(default out) scalar_tensor scatter(default reduce reduce_out src src_out value_out
value_reduce_out) scatter_add scatter_add_ select select_backward set_(default source_Storage
source_Storage_storage_offset source_Tensor source_Tensor_storage_offset) sgn(default out)
sigmoid(default out) sigmoid_backward(default grad_input) sign(default out) signbit(default out)
silu(default out) silu_ silu_backward sin(default out) slice slice_backward softmax softplus(default
out) softplus_backward(default grad_input) split sqrt(default out) squeeze stack(default out)
sub(Scalar Scalar_out Tensor out) sub_(Tensor) sum(default IntList_out dim_IntList) swapaxes
swapdims t tanh(default out) tanh_backward threshold(default out) threshold_backward(default
grad_input) topk(default out values) transpose tril(default out) triu(default out) trunc(default
out) unfold unsqueeze value_selecting_reduction_backward view view_as view_as_complex view_as_real
vstack(default out) where(self self_out) zero_ zeros(default out)
"""
KERNELS: frozenset[str] = frozenset(
    f"{base}.{overload}" if overload != "default" else base
    for base, overloads in re.findall(r"([A-Za-z0-9_]+)(?:\(([^)]*)\))?", _LISTED)
    for overload in (overloads.split() if overloads else ["default"]))
BASE_NAMES: frozenset[str] = frozenset(name.partition(".")[0] for name in KERNELS)

# Composites that only describe or reshape memory (views, dtype and layout no-ops) or that get a
# kernel of their own (contiguous): no layer for them, they are not worth a NEFF on Trainium either.
_METADATA = frozenset({
    "adjoint", "chunk", "conj", "contiguous", "expand_as", "imag", "mH", "mT", "narrow", "real", "reshape",
    "reshape_as", "swapaxes", "swapdims", "view_as", "_has_compatible_shallow_copy_type", "set_", "atleast_2d",
    "_conj", "alias", "detach", "diagonal", "expand", "permute", "squeeze", "unsqueeze", "t", "_neg_view",
    "view", "as_strided", "_reshape_alias", "unfold", "view_as_real", "view_as_complex", "record_stream",
    "_local_scalar_dense", "_copy_from_and_resize", "resize_", "empty", "empty_strided", "_to_copy", "copy_"})


def has_kernel(op: str) -> bool:
    """Whether TorchNeuron has a neuron kernel for op 'aten::name.overload' (by its base name)."""
    namespace, _, rest = op.partition("::")
    if namespace != "aten":
        return True  # its own namespaces (c10d, neuron) are not aten fallbacks
    base = rest.partition(".")[0]
    return base in BASE_NAMES or (base.endswith("_") and base[:-1] in BASE_NAMES)


def _has_kernel_for(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key)
    except RuntimeError:  # no such overload
        return False


@functools.lru_cache(maxsize=None)
def named_composites() -> tuple[str, ...]:
    """The overloads TorchNeuron has a kernel for that reach no neuron kernel here: composites with
    no CPU kernel (and none of ours), which would be tracked under the names of their parts. Not
    those that only call their own ``.out`` overload (``abs`` runs ``abs.out``): that is tracked
    under the op's name already. Read once, before they are registered (then they have a neuron kernel)."""
    named = []
    for name in sorted(KERNELS):
        base, _, overload = name.partition(".")
        if base in _METADATA or (overload != "out" and _has_kernel_for(f"{base}.out", "CPU")):
            continue
        try:
            torch._C._dispatch_find_schema_or_throw(f"aten::{base}", overload)
        except RuntimeError:
            continue  # not an op of this torch
        if _has_kernel_for(name, "CPU") or _has_kernel_for(name, "PrivateUse1"):
            continue
        if _has_kernel_for(name, "CompositeImplicitAutograd") or _has_kernel_for(name, "CompositeExplicitAutograd"):
            named.append(name)
    return tuple(named)


def _out_overload(inplace: str) -> str | None:
    """The ``.out`` overload that in-place op 'name_.overload' writes through: the one of the base op
    whose arguments, besides ``out``, are the in-place op's (``tril_`` -> ``tril.out``,
    ``bitwise_and_.Tensor`` -> ``bitwise_and.Tensor_out``)."""
    base, _, overload = inplace.partition(".")
    wanted = [(a.name, str(a.type)) for a in torch._C._get_schema(f"aten::{base}", overload).arguments]
    for candidate in torch._C._jit_get_schemas_for_operator(f"aten::{base[:-1]}"):
        arguments = [(a.name, str(a.type)) for a in candidate.arguments if not a.is_out]
        if candidate.overload_name.endswith("out") and arguments == wanted:
            return f"{base[:-1]}.{candidate.overload_name}"
    return None


@functools.lru_cache(maxsize=None)
def _inplace_through_out() -> dict[str, str]:
    names = {}
    for name in KERNELS:
        base, _, overload = name.partition(".")
        if not overload.endswith("out") or f"{base}_" in BASE_NAMES:
            continue
        for schema in torch._C._jit_get_schemas_for_operator(f"aten::{base}_"):
            inplace = f"{base}_.{schema.overload_name}" if schema.overload_name else f"{base}_"
            if _has_kernel_for(inplace, "CompositeExplicitAutogradNonFunctional"):
                out = _out_overload(inplace)
                if out in KERNELS:
                    names[f"aten::{inplace}"] = f"aten::{out}"
    return names


def tracked_name(op: str) -> str:
    """The name TorchNeuron's op tracking gives a call of op 'aten::name.overload'. An in-place op it has
    no kernel for, whose ``.out`` overload it has, runs PyTorch's generic in-place kernel, which calls
    that ``.out`` kernel (``tril_`` is tracked as ``aten::tril.out``); every other op keeps its name."""
    return _inplace_through_out().get(op, op)
