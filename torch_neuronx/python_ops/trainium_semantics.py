"""Trainium's eager semantics on demand: ``TORCH_NEURONX_EAGER_SEMANTICS=trainium``.

By default (``cpu``) a neuron op computes exactly what CPU PyTorch computes. With ``trainium``, eager
ops on neuron tensors compute and behave as TorchNeuron's eager mode does, wherever a host can
reproduce it (each rule names the TorchNeuron file it follows, in its public source v0.1.0):

- int64 is computed as int32 and float64 as float32, then cast back, for tensors with at least one
  dimension (0-dim tensors keep their dtype; tensors in lists are all cast), and ``dtype=float64``
  computes in float32 (``python_ops/dtype_autocast.py``, the JAX dtype map in
  ``python_ops/jax/type_converter.py``). int64 arithmetic here runs on int64 kernels over values
  wrapped to int32 and wraps the results again: for the ring operations (add, sub, mul, sums,
  products, bit operations, comparisons, indexing) that is exactly int32 arithmetic, and every CPU
  kernel that requires int64 indices still gets them;
- ``out=`` tensors keep their dtype: a float64 or int64 ``out`` is filled with the 32-bit result
  (``validate_output_dtypes`` with casting on, as on the JAX path);
- a copy that changes the memory format (``.to(memory_format=torch.channels_last)``, to or from
  neuron) raises (``python_ops/cast_policy.py``, ``validate_neuron_memory_format``), and so does
  ``copy_`` between two neuron cores (``csrc/utils/CopyUtils.cpp``, ``copy_neuron_to_neuron``);
- an in-place op or ``out=`` into a non-contiguous view of a contiguous tensor raises (the kernel writes
  its output tensor as is, and takes contiguous tensors only: ``csrc/core/NeuronBindings.cpp``,
  ``python_ops/torch_mlir/kernel.py``);
- dtypes missing from the JAX map (float8_e4m3fn and its variants, uint16, uint32, uint64) raise
  ``ValueError`` on device ops (``type_converter_base.py``, ``python_ops/jax/op_impl.py``);
- reductions without an identity (max, min, amax, amin, argmax, argmin, std_mean, var_mean) raise on
  empty inputs; the others give their identity, as CPU does (``python_ops/jax/config.py``,
  ``ReductionOps``);
- dropout masks are drawn with ``torch.bernoulli`` on the CPU generator (``python_ops/jax/ops/
  native_dropout.py``), and every op TorchNeuron runs on the CPU (:mod:`.host_ops`: linear algebra,
  random numbers, sort, FFT, ...) runs here on CPU copies, with CPU's arithmetic and the CPU
  generator (``python_ops/base.py``, ``_unhandled_cpu_fallback``);
- collectives send int64 as int32 and float64 as float32 (``python_ops/xla_builder/op_impl.py``: its
  collectives run under ``autocast_neuron``): int64 values are wrapped to int32, float64 values
  rounded to float32, before the collective and after it.

Not reproduced: asynchronous errors (here an op raises where it is called), the fusion of queued
ops, JAX's own type promotion, Python scalars (here they keep their value and width). Compiled
graphs keep their own rules (the executor's). The mode applies to the thread that imported torch
(and autograd's backward, which runs on it); other threads compute as CPU does.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode
from torch.utils._pytree import tree_map

from torch_neuronx.python_ops import op_classes
from torch_neuronx.runtime import BACKEND_NAME

ENV = "TORCH_NEURONX_EAGER_SEMANTICS"
CHOICES = ("cpu", "trainium")
MEMORY_FORMAT_ERROR = "Neuron tensors only support contiguous or preserve memory format"
# Missing from TorchNeuron's torch -> JAX dtype map.
UNSUPPORTED_DTYPES = frozenset(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32",
                                      "uint64") if hasattr(torch, name))
# TorchNeuron's kernels take contiguous tensors only (csrc/core/NeuronBindings.cpp, PrepareKernelTensors), and
# an op that writes in place, or into out=, runs its kernel with that tensor as the output
# (python_ops/auto_registration.py; python_ops/torch_mlir/kernel.py keeps a provided output unless it must
# narrow its dtype): a non-contiguous one raises. A 64-bit target (narrowed into a fresh tensor, then copied
# back) and an empty one (no kernel runs) do not. Only a view of a contiguous tensor is sure to be as
# non-contiguous there: TorchNeuron's kernels give contiguous results where CPU's keep their inputs' layout
# (x.t() * 2 is transposed here; autograd then adds into such a buffer in place, which Trainium's is not).
NON_CONTIGUOUS_ERROR = "Cannot process non-contiguous tensors"
NON_CONTIGUOUS_FIX = ("write out of place and assign the result (x[:, 3] = x[:, 3] + 2), or work on a contiguous "
                      "tensor (y = x[:, 3].contiguous(); y.add_(2); x[:, 3] = y)")
NO_IDENTITY_REDUCTIONS = frozenset({"max", "min", "amax", "amin", "argmax", "argmin", "std_mean", "var_mean"})
# PyTorch's LSTM and GRU, layers and cells, take each time step through a fused cell on any PrivateUse1
# device (ATen's RNN.cpp). TorchNeuron has no kernel for it, and its CPU fallback finds no CPU kernel
# either (its tests/pytorch_tests/specs/ddp_spec.json: test_ddp_packed_sequence).
FUSED_CELL_OF = {"lstm": "_thnn_fused_lstm_cell", "lstm_cell": "_thnn_fused_lstm_cell",
                 "_thnn_fused_lstm_cell": "_thnn_fused_lstm_cell", "gru": "_thnn_fused_gru_cell",
                 "gru_cell": "_thnn_fused_gru_cell", "_thnn_fused_gru_cell": "_thnn_fused_gru_cell"}
# TorchNeuron's kernel for nn.MultiheadAttention's fast path (python_ops/native_multi_head_attention.py)
# refuses, in this order, a mask tensor, per-head weights and any weights; its words, then the fix.
MHA_OFF_THE_FAST_PATH = ("or keep the layer off the fast path: torch.backends.mha.set_fastpath_enabled(False), "
                         "or model.train()")
MHA_MASK_REFUSED = ("Arbitrary mask tensors not yet supported in Neuron implementation. Please use mask_type=1 for "
                    "causal masking or mask=None. For nn.MultiheadAttention: pass no attn_mask or "
                    "key_padding_mask, " + MHA_OFF_THE_FAST_PATH + ".")
MHA_PER_HEAD_REFUSED = ("Returning per-head attention weights not yet supported in Neuron implementation. Please "
                        "use average_attn_weights=True or need_weights=False.")
MHA_WEIGHTS_REFUSED = ("Returning attention weights (need_weights=True) is not yet supported in Neuron "
                       "implementation. Please use need_weights=False. For nn.MultiheadAttention "
                       "(need_weights=True by default): call it with need_weights=False, " + MHA_OFF_THE_FAST_PATH
                       + ".")
# TorchNeuron copies between neuron tensors with the runtime's device-to-device copy, which takes one
# core (csrc/utils/CopyUtils.cpp, copy_neuron_to_neuron; its test_copy_neuron_to_neuron.py).
CROSS_CORE_COPY_ERROR = "Device-to-device copy requires tensors on same Neuron core"
CROSS_CORE_COPY_FIX = ("copy through the host (dst.copy_(src.cpu())), or keep both tensors on one core; "
                       "across ranks, use a collective")
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FORMATS_OK = (None, torch.contiguous_format, torch.preserve_format)
def _neuron(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == BACKEND_NAME


def _flat(values):
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _flat(value)
        else:
            yield value


def _touches_neuron(args, kwargs) -> bool:
    """Whether a call works on plain neuron tensors (tensor subclasses, e.g. fake tensors while a
    graph is traced, keep their own rules), or makes neuron tensors (a factory's device)."""
    found = False
    for value in _flat((*args, *kwargs.values())):
        if isinstance(value, torch.Tensor):
            if type(value) not in _PLAIN:
                return False
            found = found or value.device.type == BACKEND_NAME
    if found:
        return True
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == BACKEND_NAME


_written = op_classes.written_flags


@functools.lru_cache(maxsize=None)
def _names(func) -> tuple[str, ...]:
    return tuple(a.name for a in func._schema.arguments)


# ---- the int64/float64 rule ---------------------------------------------------------------------

def _wrap32(t: torch.Tensor) -> torch.Tensor:
    """int64 values as int32 arithmetic sees them (two's complement wrap), still int64."""
    return t.to(torch.int32).to(torch.int64)


def _narrow(value, in_list: bool, seen: dict):
    """An argument as TorchNeuron computes it: float64 -> float32, int64 -> int32 values (tensors with a
    dimension, or any tensor in a list)."""
    if not isinstance(value, torch.Tensor) or not _neuron(value) or (value.dim() == 0 and not in_list):
        return value
    if value.dtype == torch.float64:
        seen["float64"] = True
        return value.to(torch.float32)
    if value.dtype == torch.int64:
        seen["int64"] = True
        return _wrap32(value)
    return value


def _narrow_all(func, args, kwargs, seen: dict):
    """The arguments as TorchNeuron computes with them; ``out=`` ones keep their dtype."""
    skip = _out_names(func)

    def narrow(name, value):
        if name in skip:
            return value
        if name == "dtype" and value == torch.float64:
            seen["float64"] = True  # computed in float32 (the JAX map), returned as float64
            return torch.float32
        if isinstance(value, (list, tuple)):
            return type(value)(_narrow(v, True, seen) for v in value)
        return _narrow(value, False, seen)

    names = _names(func)
    return ([narrow(names[i] if i < len(names) else "", v) for i, v in enumerate(args)],
            {key: narrow(key, value) for key, value in kwargs.items()})


def _restore(value, seen: dict):
    if not _neuron(value):
        return value
    if value.dtype == torch.float32 and seen.get("float64"):
        return value.to(torch.float64)
    if value.dtype == torch.int64:
        return _wrap32(value)
    return value


def _write_back(original: torch.Tensor, computed: torch.Tensor) -> None:
    """An argument the op wrote (computed on a narrowed copy, or itself): it gets the values, int64 ones
    wrapped as int32 arithmetic would have left them."""
    if computed is not original or computed.dtype == torch.int64:
        with torch.no_grad():
            original.copy_(_wrap32(computed) if computed.dtype == torch.int64 else computed)


@functools.lru_cache(maxsize=None)
def _out_names(func) -> frozenset[str]:
    """Keyword-only arguments the op writes (``out=``): they keep their dtype."""
    return frozenset(a.name for a in func._schema.arguments
                     if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)


def refused_write_target(t) -> bool:
    """Whether TorchNeuron's kernel refuses to write into ``t`` (see NON_CONTIGUOUS_ERROR)."""
    return (_neuron(t) and t.numel() > 0 and t.dtype not in (torch.float64, torch.int64) and not t.is_contiguous()
            and t._is_view() and t._base.is_contiguous())


def _check_write_targets(func, args, kwargs) -> None:
    if torch.Tag.inplace_view in func.tags:  # t_, transpose_: metadata only
        return
    outs = _out_names(func)
    targets = [a for a, written in zip(args, _written(func)) if written] + [v for k, v in kwargs.items() if k in outs]
    for t in _flat(targets):
        if refused_write_target(t):
            raise RuntimeError(f"{NON_CONTIGUOUS_ERROR}: on Trainium, {func.name()} writes into a non-contiguous "
                               f"tensor (shape {tuple(t.shape)}, strides {t.stride()}), and TorchNeuron's kernels "
                               f"take contiguous tensors only: {NON_CONTIGUOUS_FIX}")


def _device_op(func, args, kwargs):
    _check_write_targets(func, args, kwargs)
    _check_dtypes(func, args, kwargs)
    _check_empty_reduction(func, args)
    seen: dict = {}
    new_args, new_kwargs = _narrow_all(func, args, kwargs, seen)
    if not seen and not any(_neuron(v) and v.dtype == torch.int64 for v in _flat((*args, *kwargs.values()))):
        return func(*args, **kwargs)
    result = func(*new_args, **new_kwargs)
    written = _written(func)
    replaced = {}  # id of a narrowed copy -> the caller's argument
    for i, (old, new) in enumerate(zip(args, new_args)):
        if isinstance(old, torch.Tensor) and new is not old:
            replaced[id(new)] = old
            if i < len(written) and written[i]:
                _write_back(old, new)
    outs = {id(v) for key, v in kwargs.items() if key in _out_names(func)}

    def back(value):
        if isinstance(value, torch.Tensor) and id(value) in replaced:
            return replaced[id(value)]  # an in-place op returns its (original) argument
        if isinstance(value, torch.Tensor) and id(value) in outs:
            _write_back(value, value)  # out=: keeps its dtype, int64 wrapped as int32 would leave it
            return value
        return _restore(value, seen)

    return tree_map(back, result)


def _check_dtypes(func, args, kwargs) -> None:
    for value in _flat((*args, *kwargs.values())):
        dtype = value.dtype if _neuron(value) else value if isinstance(value, torch.dtype) else None
        if dtype in UNSUPPORTED_DTYPES:
            raise ValueError(f"Unsupported PyTorch dtype: {dtype} (on Trainium, {func.name()} lowers through JAX, "
                             "which has no such dtype; use a supported one, e.g. float8_e5m2, int32, bfloat16)")


def _check_empty_reduction(func, args) -> None:
    if op_classes.base_name(func.name()) in NO_IDENTITY_REDUCTIONS and any(
            isinstance(v, torch.Tensor) and v.numel() == 0 for v in _flat(args)):
        raise RuntimeError(f"Cannot perform {func.name()} on empty tensor (no identity value)")


# ---- ops TorchNeuron does not run on a NeuronCore -----------------------------------------------

def _host_op(func, args, kwargs):
    """As TorchNeuron's CPU fallback: the op on CPU copies (CPU's arithmetic, the CPU generator), the
    results copied back; arguments the op writes get its values."""
    device = next((v.device for v in _flat((*args, *kwargs.values())) if _neuron(v)), None)
    to_cpu = functools.partial(tree_map, lambda v: v.cpu() if _neuron(v) else v)
    cpu_args, cpu_kwargs = to_cpu(list(args)), to_cpu(dict(kwargs))
    if "device" in cpu_kwargs and cpu_kwargs["device"] is not None and \
            torch.device(cpu_kwargs["device"]).type == BACKEND_NAME:
        device = device or torch.device(cpu_kwargs["device"])
        cpu_kwargs["device"] = torch.device("cpu")
    device = device or torch.device(BACKEND_NAME, torch.accelerator.current_device_index())
    result = func(*cpu_args, **cpu_kwargs)
    originals = {}
    for old, new in zip(_flat((*args, *kwargs.values())), _flat((*cpu_args, *cpu_kwargs.values()))):
        if _neuron(old) and isinstance(new, torch.Tensor):
            originals[id(new)] = old
    for i, (old, new) in enumerate(zip(args, cpu_args)):
        if i < len(_written(func)) and _written(func)[i] and _neuron(old):
            _write_back(old, new)
    for key, value in kwargs.items():
        if _neuron(value) and key in _out_names(func):
            _write_back(value, cpu_kwargs[key])

    def back(value):
        if isinstance(value, torch.Tensor) and id(value) in originals:
            return originals[id(value)]
        return value.to(device) if isinstance(value, torch.Tensor) else value

    return tree_map(back, result)


def _dropout(func, args, kwargs):
    """``native_dropout`` as TorchNeuron writes it: the mask drawn on the CPU generator."""
    names = _names(func)
    bound = {**dict(zip(names, args)), **kwargs}
    x, p, train = bound["input"], float(bound["p"]), bound.get("train")
    if train is None:
        train = True
    if train and not 0.0 <= p <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not train or p == 0.0:
        mask, scale = torch.ones(x.shape, dtype=torch.bool, device=x.device), 1.0
    elif p == 1.0:
        mask, scale = torch.zeros(x.shape, dtype=torch.bool, device=x.device), 0.0
    else:
        mask = torch.bernoulli(torch.empty(x.shape, dtype=torch.bool), 1.0 - p).to(x.device)
        scale = 1.0 / (1.0 - p)
    return _device_op(torch.ops.aten.mul.Tensor, (x * mask.to(x.dtype), scale), {}), mask


# ---- collectives -------------------------------------------------------------------------------

def _as_sent(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.int64:
        return _wrap32(t)
    if t.dtype == torch.float64:
        return t.to(torch.float32).to(torch.float64)
    return t


def _collective(func, args, kwargs):
    """What TorchNeuron's process group sends: int64 as int32, float64 as float32. Inputs are sent
    narrowed (copies, unless the collective writes them anyway) and the results narrowed once the
    collective completed."""
    names = _names(func)
    new_args, touched = [], []
    for i, value in enumerate(args):
        tensors = [v for v in _flat([value]) if _neuron(v) and v.dtype in (torch.int64, torch.float64)]
        if not tensors:
            new_args.append(value)
            continue
        sent, received = _collective_role(func, names[i] if i < len(names) else "")
        if received:
            touched.extend(tensors)
        if sent and received:  # sent and received in place (all_reduce, broadcast)
            with torch.no_grad():
                for t in tensors:
                    t.copy_(_as_sent(t))
        elif sent:  # sent only: narrowed copies, the caller's tensors unchanged
            value = tree_map(lambda v: _as_sent(v) if _neuron(v) else v, value)
        new_args.append(value)
    result = func(*new_args, **kwargs)
    if touched:
        from torch.distributed import Work

        for value in _flat(result if isinstance(result, (list, tuple)) else [result]):
            if isinstance(value, torch.ScriptObject):  # the collective's Work: its results are not there yet
                Work.unbox(value).wait()
        with torch.no_grad():
            for t in touched:
                t.copy_(_as_sent(t))
    return result


def _collective_role(func, name: str) -> tuple[bool, bool]:
    """(sent, received) for an argument of a c10d op: its schemas carry no alias annotations, but their
    names say it (output_tensors, input_tensors; `tensors` both, except for send and recv)."""
    if name.startswith("output"):
        return False, True
    if name.startswith("input"):
        return True, False
    if name != "tensors":
        return False, False
    op = func.name().split("::")[-1].split(".")[0]
    return op != "recv_", op != "send"


_RULES: dict[str, Callable] = {"device": _device_op, "host": _host_op, "dropout": _dropout,
                               "collective": _collective}


class TrainiumSemantics(TorchDispatchMode):
    """Eager ops on neuron tensors as TorchNeuron computes them (see the module's docstring)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # torch.compile compiles as usual: compiled graphs keep the executor's rules

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _touches_neuron(args, kwargs):
            return func(*args, **kwargs)
        if op_classes.base_name(func.name()) in ("_thnn_fused_lstm_cell", "_thnn_fused_gru_cell"):
            raise RuntimeError(no_cpu_kernel_error(op_classes.base_name(func.name())))
        if op_classes.base_name(func.name()) == "_native_multi_head_attention":
            _check_mha(func, args, kwargs)
        kind = op_classes.kind_of(func)
        if kind == "move":
            _check_memory_format(func, args, kwargs)
            _check_one_core(func, args)
            return func(*args, **kwargs)
        return _RULES[kind](func, args, kwargs)


def crosses_cores(tensors) -> bool:
    """Whether these tensors are neuron tensors on more than one core."""
    return len({t.device.index for t in tensors if _neuron(t)}) > 1


def _check_one_core(func, args) -> None:
    if op_classes.base_name(func.name()) == "copy" and len(args) >= 2 and crosses_cores(args[:2]):
        raise RuntimeError(f"{CROSS_CORE_COPY_ERROR} (from {args[1].device} to {args[0].device}): "
                           f"{CROSS_CORE_COPY_FIX}")


def _check_memory_format(func, args, kwargs) -> None:
    if op_classes.base_name(func.name()) in ("_to_copy", "contiguous") and kwargs.get("memory_format") not in _FORMATS_OK:
        raise RuntimeError(f"{func.name().split('.')[0]}: {MEMORY_FORMAT_ERROR}")


class _InvalidChoice(TorchDispatchMode):
    """An invalid TORCH_NEURONX_EAGER_SEMANTICS: every neuron op says so, rather than run as CPU would."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _touches_neuron(args, kwargs):
            raise ValueError(self.message)
        return func(*args, **kwargs)


_installed: TorchDispatchMode | None = None


def no_cpu_kernel_error(cell: str) -> str:
    """TorchNeuron's words when its CPU fallback meets an op CPU has no kernel for (CPUFallbackExecutor.cpp)."""
    return (f"CPU fallback execution failed for 'aten::{cell}': Could not run 'aten::{cell}' with arguments from "
            "the 'CPU' backend. TorchNeuron has no kernel for it: run the LSTM or GRU on the CPU, or write its "
            "step from nn.Linear, torch.sigmoid and torch.tanh")


def mha_refusal(has_mask: bool, need_weights: bool, average_attn_weights: bool = True) -> str | None:
    """What TorchNeuron's _native_multi_head_attention raises for these arguments, or None."""
    if has_mask:
        return MHA_MASK_REFUSED
    if need_weights and average_attn_weights is False:
        return MHA_PER_HEAD_REFUSED
    return MHA_WEIGHTS_REFUSED if need_weights else None


def _check_mha(func, args, kwargs) -> None:
    given = dict(zip(_names(func), args), **kwargs)
    refused = mha_refusal(given.get("mask") is not None, given.get("need_weights", True),
                          given.get("average_attn_weights", True))
    if refused is not None:
        raise NotImplementedError(refused)


def current() -> str:
    """The eager semantics of this thread: "trainium" or "cpu"."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return "trainium" if any(isinstance(m, TrainiumSemantics) for m in _get_current_dispatch_mode_stack()) else "cpu"


@contextlib.contextmanager
def eager_semantics(choice: str = "trainium"):
    """Within this block (this thread), eager neuron ops follow ``choice``: "trainium" or "cpu"."""
    if choice not in CHOICES:
        raise ValueError(f"eager semantics {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "cpu" or current() == "trainium":
        if choice == "cpu" and current() == "trainium":
            with torch.utils._python_dispatch._disable_current_modes():
                yield
            return
        yield
        return
    with TrainiumSemantics():
        yield


def install() -> None:
    """Read TORCH_NEURONX_EAGER_SEMANTICS (at registration) and, for "trainium", apply it to this thread."""
    global _installed
    value = os.environ.get(ENV, "").strip().lower() or "cpu"
    if value == "cpu" or _installed is not None:
        return
    if value in CHOICES:
        _installed = TrainiumSemantics()
    else:
        _installed = _InvalidChoice(f"{ENV}={os.environ[ENV]!r} is invalid: use 'cpu' (the default: CPU's "
                                    "arithmetic) or 'trainium' (TorchNeuron's eager semantics)")
    _push_mode(_installed)


def uninstall() -> None:
    """Undo :func:`install` (tests), when its mode is the innermost one."""
    global _installed
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _installed is not None and _get_current_dispatch_mode() is _installed:
        _pop_mode()
        _installed = None
