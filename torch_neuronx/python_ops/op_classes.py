"""What kind of op a call is, by its name: the one classification the cost model, the readiness
findings and Trainium's eager semantics all read.

- names: :func:`base_name` ('aten::add_.Tensor' -> 'add'), :func:`op_overload`;
- the host table's entry (:func:`lookup` in :mod:`.host_ops`' data);
- what TorchNeuron does with it (:func:`op_kind`: device, host, move, dropout, collective);
- the family the estimate reports it under (:func:`family`: matmul, convolution, attention, ...)
  and whether it draws random numbers (:func:`uses_generator`);
- all that the findings ask, at once (:func:`classify`).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from torch_neuronx.python_ops.host_ops import TABLE, UnsupportedOp


def base_name(op: str) -> str:
    """'aten::add_.Tensor' -> 'add' (namespace, overload and in-place underscore removed)."""
    name = op.split("::", 1)[-1].split(".", 1)[0]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@functools.lru_cache(maxsize=None)
def lookup(op: str) -> UnsupportedOp | None:
    """The table's entry for an op name ('aten::normal_', 'aten::normal_.default', 'aten::normal'), or None."""
    return TABLE.get(f"{op.partition('::')[0]}::{base_name(op)}")


# Ops that move or describe memory rather than compute: TorchNeuron runs no kernel of its own on
# their values (copies to and from 64-bit go through the host), so their values are CPU's.
_MOVES = frozenset({"_to_copy", "copy", "clone", "detach", "alias", "lift_fresh", "lift_fresh_copy", "empty",
                    "empty_strided", "empty_like", "new_empty", "new_empty_strided", "_local_scalar_dense", "resize",
                    "set", "record_stream", "_has_compatible_shallow_copy_type", "_copy_from", "_copy_from_and_resize",
                    "_reshape_alias", "as_strided", "view", "_unsafe_view", "_pin_memory", "is_pinned",
                    "_nested_tensor_from_mask_left_aligned", "contiguous"})


MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addbmm", "matmul", "linear", "addmv", "mv",
              "dot", "vdot", "_int_mm", "addr", "outer"}
REDUCTION_OPS = {"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean", "std_mean",
                 "argmax", "argmin", "cumsum", "cumprod", "logsumexp", "any", "all", "linalg_vector_norm",
                 "norm", "aminmax", "count_nonzero", "median", "nansum"}
DATA_MOVEMENT_OPS = {"cat", "stack", "gather", "scatter", "scatter_add", "scatter_reduce", "index", "index_put",
                     "_index_put_impl", "index_select", "index_add", "index_copy", "embedding",
                     "embedding_dense_backward", "_unsafe_index", "repeat", "clone", "constant_pad_nd", "flip",
                     "roll", "sort", "topk", "masked_fill", "masked_scatter", "masked_select", "nonzero",
                     "_unsafe_view", "tril", "triu", "fill", "zero", "arange", "full", "ones", "zeros",
                     "repeat_interleave", "copy", "_to_copy", "upsample_nearest2d", "upsample_bilinear2d",
                     "_upsample_nearest_exact2d", "reflection_pad2d", "replication_pad2d", "unfold", "im2col",
                     "col2im", "slice_scatter", "select_scatter", "diagonal_scatter", "where"}
HOST_TRANSFER = "host transfer"
COLLECTIVE = "collective"
NOT_ESTIMATED = (HOST_TRANSFER, COLLECTIVE)  # not HBM-bound work: counted, never costed


@functools.lru_cache(maxsize=None)
def op_overload(op: str):
    """The OpOverload of 'ns::name.overload' (or 'ns::name'), or None."""
    namespace, _, rest = op.partition("::")
    name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=None)
def written_flags(func) -> tuple[bool, ...]:
    """For each argument of an OpOverload, whether the op writes it."""
    return tuple(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


@functools.lru_cache(maxsize=None)
def written_arguments(op: str) -> tuple[bool, int]:
    """Which arguments the op writes values into (not only metadata, as t_ does): (whether its first
    argument, in place; how many trailing out= arguments)."""
    overload = op_overload(op)
    if overload is None or torch.Tag.inplace_view in overload.tags:
        return False, 0
    written = written_flags(overload)
    outs = sum(1 for a, w in zip(overload._schema.arguments, written) if w and a.kwarg_only)
    return bool(written) and written[0], outs


def written_tensors(op: str, tensors: list) -> list:
    """Of an op call's tensor arguments in order (those present), the ones it writes values into."""
    return _written_of(written_arguments(op), tensors)


def _written_of(written: tuple[bool, int], tensors: list) -> list:
    first, outs = written
    return (tensors[:1] if first else []) + (tensors[len(tensors) - outs:] if outs else [])


RANDOM_OPS = {"native_dropout", "_fused_dropout", "rand", "randn", "randint", "rand_like", "randn_like",
              "randint_like"}  # random without a Generator argument in their schema


@functools.lru_cache(maxsize=None)
def uses_generator(op: str) -> bool:
    """Whether the op draws random numbers (its schema takes a Generator, or it is dropout)."""
    if base_name(op) in RANDOM_OPS:
        return True
    overload = op_overload(op)
    if overload is None:
        return False
    return any("Generator" in str(arg.type) for arg in overload._schema.arguments)


@functools.lru_cache(maxsize=None)
def family(op: str) -> str:
    """The op family a call is reported under."""
    if op.startswith("c10d::"):
        return COLLECTIVE
    base = base_name(op)
    if base in MATMUL_OPS:
        return "matmul"
    if "convolution" in base or base.startswith("conv"):
        return "convolution"
    if "scaled_dot_product" in base or "flash_attention" in base or "efficient_attention" in base:
        return "attention"
    if uses_generator(op):
        return "random"
    if "softmax" in base:
        return "softmax"
    if "norm" in base and base not in REDUCTION_OPS:
        return "normalization"
    if base == "_local_scalar_dense":
        return HOST_TRANSFER
    if base in REDUCTION_OPS:
        return "reduction"
    if base in DATA_MOVEMENT_OPS:
        return "data movement"
    overload = op_overload(op)
    if overload is not None and torch.Tag.pointwise in overload.tags:
        return "elementwise"
    if base.endswith("_backward") or base.endswith("_backward_data"):
        return "elementwise"  # the pointwise backwards (gelu, silu, threshold, ...)
    return "other"


@functools.lru_cache(maxsize=None)
def op_kind(name: str) -> str:
    """What TorchNeuron does with an op, by name ('aten::add.Tensor', 'aten::add'): "device" (a
    NeuronCore kernel), "host" (it runs on the CPU), "move" (memory, not computation), "dropout",
    "collective". The diagnostics read it to tell which rules an observed call meets."""
    overload = op_overload(name)
    try:
        if overload is not None:
            return kind_of(overload)
    except (AttributeError, RuntimeError):
        pass
    return "collective" if name.partition("::")[0] == "c10d" else "device"


@dataclasses.dataclass(frozen=True)
class OpClass:
    """All that the readiness findings ask of an op name, answered at once."""
    base: str  # base_name
    kind: str  # op_kind
    entry: UnsupportedOp | None  # lookup: the host table's entry
    draws: bool  # uses_generator
    written: tuple[bool, int]  # written_arguments

    def written_tensors(self, tensors: list) -> list:
        """Of a call's tensor arguments in order, the ones it writes values into."""
        return _written_of(self.written, tensors)


@functools.lru_cache(maxsize=None)
def classify(op: str) -> OpClass:
    """The :class:`OpClass` of an op name ('aten::add_.Tensor')."""
    return OpClass(base_name(op), op_kind(op), lookup(op), uses_generator(op), written_arguments(op))


@functools.lru_cache(maxsize=None)
def kind_of(func) -> str:
    """op_kind of an OpOverload."""
    namespace = func.namespace
    if namespace == "c10d":
        return "collective"
    base = base_name(func.name())
    if base == "native_dropout":
        return "dropout"
    if base in _MOVES or func.is_view:
        return "move"
    packet = func.overloadpacket
    random = any("Generator" in str(a.type) for name in packet.overloads()
                 for a in getattr(packet, name)._schema.arguments)
    if lookup(func.name()) is not None or random:
        return "host"  # random numbers come from the CPU generator too (randn(device="neuron") included)
    return "device"
