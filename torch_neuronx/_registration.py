"""Makes ``neuron`` a device of torch: PrivateUse1 checked free and renamed, the core loaded (it reads
the emulated topology at the first use of a device), then each part of the backend installed by the
module that owns it."""
import torch

from torch_neuronx import distributed, neuron, python_ops
from torch_neuronx.interop import distribution_alias, dlpack, dynamo_rules, ecosystem_errors, threads
from torch_neuronx.runtime import BACKEND_NAME, checkpoint_pages, core, warn_once

# TorchNeuron's torch.neuron aliases of the compiler's metrics, imported on first use (the
# compiler loads torch._dynamo, which `import torch` should not pay for).
NEURON_ALIASES = {name: ("torch_neuronx.neuron_dynamo_backend", name)
                  for name in ("get_dynamo_metrics", "reset_dynamo_metrics")}

# The package whose top-level device API (TorchNeuron's torch_neuronx.set_device, ...) torch.neuron calls.
PACKAGE = "torch_neuronx"
_registered = False


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


def register_for_autoload() -> bool:
    """Register from torch's autoload: never raise, so `import torch` always succeeds."""
    try:
        return register(on_conflict="warn")
    except Exception as error:  # noqa: BLE001 - any failure must leave torch importable
        warn_once("registration", (
            f"torch_neuronx (torch-neuronx-cpu) failed to register the 'neuron' device: {error!r}. "
            "torch works without it. Reinstall it against this torch (pip install --no-build-isolation "
            "--force-reinstall --no-deps torch-neuronx-cpu, or pip install --no-build-isolation -e . in a checkout), "
            "or disable autoloading with TORCH_DEVICE_BACKEND_AUTOLOAD=0."))
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
            "with TORCH_DEVICE_BACKEND_AUTOLOAD=0.")
        if on_conflict == "raise":
            raise BackendConflictError(message)
        warn_once("registration", message)
        return False

    core.load_core()  # the visible cores are read at the first use of a device, not here
    if torch._C._get_privateuse1_backend_name() != BACKEND_NAME:
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    neuron.install(NEURON_ALIASES, package=PACKAGE)
    python_ops.install()
    checkpoint_pages.install()
    for adaptation in (threads, dlpack, distribution_alias, ecosystem_errors, dynamo_rules):
        adaptation.install()
    distributed.install()
    _registered = True
    return True
