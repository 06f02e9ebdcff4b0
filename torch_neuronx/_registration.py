"""Makes ``neuron`` a device of torch: PrivateUse1 renamed, the core loaded,
``torch.neuron`` registered, tensor/module/storage methods generated."""
import sys
import warnings

import torch

BACKEND_NAME = "neuron"

_registered = False
_warned = False

# Ops with no CPU kernel whose generic kernel checks for the devices it knows and refuses
# neuron ("mode only supports CPU, CUDA and XPU device type"); CPU runs that same generic
# kernel, so the fallback runs it on CPU aliases of the neuron tensors.
ROUTED_TO_FALLBACK = ["mode.values"]


class BackendConflictError(RuntimeError):
    """PrivateUse1 already belongs to another backend."""


def is_registered() -> bool:
    return _registered


def _conflict() -> str | None:
    """Why PrivateUse1 can't be ours, or None if it is free (or already ours)."""
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", BACKEND_NAME):
        return f"PrivateUse1 is already registered as {name!r} by another backend"
    if name == BACKEND_NAME and not _registered:
        return "a 'neuron' backend (e.g. AWS's torch-neuronx) is already registered in this process"
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is not None and accelerator.type == "privateuseone":
        return "another extension already registered PrivateUse1 hooks"
    return None


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        _warned = True


def register_for_autoload() -> bool:
    """Register from torch's autoload: never raise, so `import torch` always succeeds."""
    try:
        return register(on_conflict="warn")
    except Exception as error:  # noqa: BLE001 - any failure must leave torch importable
        _warn_once(
            f"torch_neuronx (torch-neuronx-cpu) failed to register the 'neuron' device: {error!r}. "
            "torch works without it. Reinstall it against this torch (pip install --no-build-isolation "
            "--force-reinstall --no-deps torch-neuronx-cpu, or pip install --no-build-isolation -e . in a checkout), "
            "or disable autoloading with TORCH_DEVICE_BACKEND_AUTOLOAD=0."
        )
        return False


def register(on_conflict: str = "raise") -> bool:
    """Register the neuron backend once. Returns True when neuron is (now) ours."""
    global _registered
    if _registered:
        return True
    problem = _conflict()
    if problem is not None:
        message = (
            f"torch_neuronx (torch-neuronx-cpu) did not register the 'neuron' device: {problem}. "
            "The other backend is left untouched. Uninstall one of the two, or disable autoloading "
            "with TORCH_DEVICE_BACKEND_AUTOLOAD=0."
        )
        if on_conflict == "raise":
            raise BackendConflictError(message)
        _warn_once(message)
        return False

    from torch_neuronx import _library, distribution_alias, dlpack, recurrent, threads

    _library.load()
    apply_topology()
    torch.ops.neuron._route_generic_kernel_ops_to_fallback()
    torch.ops.neuron._route_ops_to_fallback(ROUTED_TO_FALLBACK)
    torch.ops.neuron._route_c10d_ops_to_fallback()
    recurrent.register()
    dlpack.install()
    threads.install()
    distribution_alias.install()
    if torch._C._get_privateuse1_backend_name() != BACKEND_NAME:
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)

    from torch_neuronx import neuron as neuron_module

    torch._register_device_module(BACKEND_NAME, neuron_module)
    # `import torch.neuron.memory` must find the same module objects, not load copies.
    for name in ("memory", "random", "streams", "properties"):
        sys.modules[f"torch.{BACKEND_NAME}.{name}"] = getattr(neuron_module, name)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    # Trainium computes in bfloat16: make it autocast's default dtype on neuron.
    torch.set_autocast_dtype(BACKEND_NAME, torch.bfloat16)
    neuron_module._install_fork_handler()
    from torch_neuronx import distributed

    distributed.register()
    _registered = True
    return True


def apply_topology() -> None:
    """(Re)read the emulated instance from the environment and size the devices to it.

    A bad environment variable does not fail registration: no device is visible and
    every use of neuron raises the message naming the variable (device_count() too).
    Must run before the runtime initializes (the first neuron tensor).
    """
    from torch_neuronx import topology

    if torch.ops.neuron._is_initialized():
        raise RuntimeError(
            "The neuron runtime is already initialized (a neuron tensor exists): the visible cores can no "
            "longer change. Set NEURON_RT_VISIBLE_CORES and friends before the first use of neuron.")
    topo = topology.refresh()
    if topo is None:
        torch.ops.neuron._set_device_count(0)
        torch.ops.neuron._set_config_error(str(topology.error()))
        return
    torch.ops.neuron._set_config_error("")
    torch.ops.neuron._set_device_count(len(topo.visible_cores))
    if torch.ops.neuron._current_device() >= len(topo.visible_cores):
        torch.ops.neuron._set_device(0)  # fewer devices now: the old index may not exist
    torch.ops.neuron._set_instance_description(topo.describe())
    for index, core in enumerate(topo.visible_cores):
        torch.ops.neuron._set_device_memory(index, topo.device_memory, core)
