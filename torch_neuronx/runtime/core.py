"""The C++ core: loading it, its ops (``torch.ops.neuron``), and the emulated topology applied
to it. The core registers the neuron kernels, allocator, device guard and hooks with torch."""
from __future__ import annotations

import importlib.machinery
import os

import torch

from torch_neuronx.runtime import topology

BACKEND_NAME = "neuron"

# The core's ops. The namespace resolves each op when it is called, so this is valid before
# load_core().
ops = torch.ops.neuron

# Ops with no CPU kernel whose generic kernel checks for the devices it knows and refuses
# neuron ("mode only supports CPU, CUDA and XPU device type"); CPU runs that same generic
# kernel, so the fallback runs it on CPU aliases of the neuron tensors.
ROUTED_TO_FALLBACK = ["mode.values"]

_REBUILD = ("Rebuild it against the running Python and torch: pip install --no-build-isolation --force-reinstall "
            "--no-deps torch-neuronx-cpu (from a checkout: pip install --no-build-isolation -e .)")
_loaded = False


def core_path() -> str:
    """The core built for this interpreter: ``_C`` with one of its extension suffixes."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(package, "_C" + suffix)
        if os.path.isfile(path):
            return path
    others = sorted(name for name in os.listdir(package) if name.startswith("_C") and name.endswith((".so", ".pyd")))
    found = f" (found {', '.join(others)}, built for another Python)" if others else ""
    raise ImportError(
        f"torch_neuronx: the C++ core for this Python ({'_C' + importlib.machinery.EXTENSION_SUFFIXES[0]}) is "
        f"missing from {package}{found}. {_REBUILD}")


def load_core() -> None:
    """Load the core once, and send the ops neuron has no kernel of its own for to its fallback."""
    global _loaded
    if _loaded:
        return
    path = core_path()
    try:
        torch.ops.load_library(path)
    except OSError as error:  # typically an undefined symbol: built against another torch
        raise ImportError(f"torch_neuronx: the C++ core {path} does not load with torch {torch.__version__}: "
                          f"{error}. {_REBUILD}") from error
    ops._route_generic_kernel_ops_to_fallback()
    ops._route_ops_to_fallback(ROUTED_TO_FALLBACK)
    ops._route_c10d_ops_to_fallback()
    _loaded = True


def apply_topology() -> None:
    """(Re)read the emulated instance from the environment and size the devices to it.

    The core calls this itself at the first question about the devices (:func:`read_topology`);
    call it again to change them before the runtime initializes (the first neuron tensor), as
    binding under torchrun does. A bad environment variable does not fail: no device is visible
    and every use of neuron raises the message naming the variable (device_count() too).
    """
    if ops._is_initialized():
        raise RuntimeError(
            "The neuron runtime is already initialized (a neuron tensor exists): the visible cores can no "
            "longer change. Set NEURON_RT_VISIBLE_CORES and friends before the first use of neuron.")
    _size_devices(topology.refresh())


def read_topology() -> None:
    """The core's first question about the devices (device_count(), a first tensor, set_device, ...)
    reads the environment, as TorchNeuron's runtime does when it starts: NEURON_RT_VISIBLE_CORES and
    friends set after ``import torch`` but before that first use take effect."""
    _size_devices(topology.refresh())


def _size_devices(topo) -> None:
    if topo is None:
        ops._set_config_error(str(topology.error()))
        ops._set_device_count(0)
        return
    ops._set_config_error("")
    ops._set_device_count(len(topo.visible_cores))
    if ops._current_device() >= len(topo.visible_cores):
        ops._set_device(0)  # fewer devices now: the old index may not exist
    ops._set_instance_description(topo.describe())
    for index, core in enumerate(topo.visible_cores):
        ops._set_device_memory(index, topo.device_memory, core)


def bind_devices(local_rank: int, local_world: int) -> None:
    """TorchNeuron's numbering under torchrun (its NeuronDevice.cpp): this process's one visible
    core becomes ``neuron:<local_rank>``, ``device_count()`` the local world size, and the local
    rank every thread's current device. Must run before the runtime initializes."""
    topo = topology.bind(local_rank, local_world)
    ops._bind_devices(local_rank, local_world)
    for index in range(local_world):  # another rank's index: a device of the node, empty here
        ops._set_device_memory(index, topo.device_memory, topo.core_of(index))
