"""``torch_neuronx.utils``: TorchNeuron's user-facing helpers, answered for the emulated instance.

The environment switches read as TorchNeuron reads them (exactly ``"1"`` is on), with the defaults its
package sets at import (:func:`set_env_defaults`); the platform answers (target, LNC, float8 support)
come from the emulated topology (``runtime.topology``), where TorchNeuron asks the Neuron runtime.
TorchNeuron's internals here (neuronxcc dtype mapping, NEFF-cache logging, op logging) are not provided.
Imports only torch and the runtime layer.
"""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

import torch

from torch_neuronx.runtime import BACKEND_NAME, ops, topology

__all__ = [
    "ENV_DEFAULTS", "cast_dtype_if_needed", "flatten_tensors", "get_device_from_tensors", "get_lnc_setting",
    "get_logical_neuron_cores", "get_neuron_registered_ops", "get_platform_target", "get_worker_multiplier",
    "is_float8_e4m3_supported", "is_float8_e4m3fn_supported", "is_mxocp_supported", "is_stablehlo_enabled",
    "is_sync_mode_enabled", "move_pytree_to_cpu", "move_pytree_to_neuron", "set_env_defaults",
    "suppress_specific_warnings", "use_mlir_aten_ops",
]

# What TorchNeuron's package sets with os.environ.setdefault at import, where code can see it: the
# switches its tests and users read. Its runtime-only ones (NEURON_RT_DBG_ZEROCOPY, ...) have no meaning
# here. Execution is always blocking here whatever NEURON_LAUNCH_BLOCKING says.
ENV_DEFAULTS = {
    "NEURON_LAUNCH_BLOCKING": "0",
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": "1",
    "TORCH_NEURONX_MLIR_ATEN_OPS": "1",
    "TORCH_NEURONX_RETAIN_DEVICE_MODE": "0",
}


def set_env_defaults() -> None:
    """Set :data:`ENV_DEFAULTS` where the environment leaves them unset (called at import)."""
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


# ---- the environment's switches, as TorchNeuron reads them ----

def is_sync_mode_enabled() -> bool:
    """True when ``NEURON_LAUNCH_BLOCKING=1``."""
    return os.environ.get("NEURON_LAUNCH_BLOCKING", "0") == "1"


def use_mlir_aten_ops() -> bool:
    """True when ``TORCH_NEURONX_MLIR_ATEN_OPS=1`` (TorchNeuron's default: eager ops lowered with torch-mlir)."""
    return os.environ.get("TORCH_NEURONX_MLIR_ATEN_OPS", "0") == "1"


def is_stablehlo_enabled() -> bool:
    """False only when ``TORCH_NEURONX_ENABLE_STABLEHLO`` is ``0`` or ``false``."""
    return os.environ.get("TORCH_NEURONX_ENABLE_STABLEHLO", "1") not in ("0", "false")


# ---- the platform: the emulated instance ----

def get_platform_target() -> str:
    """The compiler's platform target of the emulated chip: ``"trn1"``, ``"trn2"`` or ``"trn3"``."""
    return topology.current().instance.chip.target


def get_lnc_setting() -> str:
    """The logical NeuronCore config of the emulated instance, as a string (``"2"`` on Trn2 by default,
    ``NEURON_LOGICAL_NC_CONFIG`` when set)."""
    return str(topology.current().lnc)


def get_logical_neuron_cores() -> str:
    """``NEURON_LOGICAL_NC_CONFIG`` when set, else the instance's default (:func:`get_lnc_setting`)."""
    return os.environ.get(topology.LNC_ENV) or get_lnc_setting()


def get_worker_multiplier() -> int:
    """2 on Trn2 with LNC=1 (twice the logical cores), else 1: how many workers a chip's cores take."""
    return 2 if get_platform_target() == "trn2" and get_logical_neuron_cores() == "1" else 1


def is_float8_e4m3_supported() -> bool:
    return get_platform_target() == "trn2"


def is_float8_e4m3fn_supported() -> bool:
    return get_platform_target() != "trn2"


def is_mxocp_supported() -> bool:
    """Whether the chip has the OCP microscaling formats (MXFP8): not on Trn2."""
    return get_platform_target() != "trn2"


# ---- tensors ----

def flatten_tensors(obj) -> list[torch.Tensor]:
    """Every tensor in ``obj`` (a tensor, or lists and tuples of them at any depth), in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [tensor for item in obj for tensor in flatten_tensors(item)]
    return []


def _first_device(obj) -> torch.device | None:
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, (list, tuple)):
        return next((d for d in map(_first_device, obj) if d is not None), None)
    return None


def get_device_from_tensors(tensors) -> torch.device:
    """The device of the first tensor in ``tensors`` (nested lists and tuples), or the current neuron
    device when there is none (a barrier)."""
    found = _first_device(tensors)
    return found if found is not None else torch.device(BACKEND_NAME, int(ops._current_device()))


def _map_tensors(obj, fn):
    """``obj`` with ``fn`` applied to every tensor, through lists, tuples and dicts (as TorchNeuron walks them)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {key: _map_tensors(value, fn) for key, value in obj.items()}
    return obj


def move_pytree_to_cpu(obj):
    """``obj`` with every neuron tensor copied to CPU, through lists, tuples and dicts."""
    return _map_tensors(obj, lambda t: t.to("cpu") if t.device.type == BACKEND_NAME else t)


def move_pytree_to_neuron(obj):
    """``obj`` with every tensor moved to neuron, through lists, tuples and dicts."""
    return _map_tensors(obj, lambda t: t.to(BACKEND_NAME))


def cast_dtype_if_needed(tensor: torch.Tensor, target_dtype: torch.dtype | None) -> torch.Tensor:
    """``tensor`` in ``target_dtype``; the tensor itself when that is None or already its dtype."""
    if target_dtype is None or tensor.dtype == target_dtype:
        return tensor
    return tensor.to(dtype=target_dtype)


@contextmanager
def suppress_specific_warnings(patterns):
    """Inside the block, warnings whose message contains one of ``patterns`` are not shown."""
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not any(pattern in str(message) for pattern in patterns):
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


def get_neuron_registered_ops(as_sorted: bool = False, keep_variant: bool = False) -> set[str] | list[str]:
    """The ops with a kernel registered for neuron (PrivateUse1), by name without namespace: ``{"add",
    "mul", ...}``, or with their overload (``"add.Tensor"``) when ``keep_variant``; a sorted list when
    ``as_sorted``. Ops run by the fallback have no kernel of their own and are not listed."""
    names = set()
    for registration in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"):
        if "::" in registration:
            op = registration.split("::", 1)[1]
            names.add(op if keep_variant else op.split(".")[0])
    return sorted(names) if as_sorted else names


def __getattr__(name: str):
    if name == "TORCH_VERSION":  # TorchNeuron's constant; packaging imported only when asked for
        from packaging.version import Version

        return Version(torch.__version__)
    raise AttributeError(f"module 'torch_neuronx.utils' has no attribute {name!r}")
