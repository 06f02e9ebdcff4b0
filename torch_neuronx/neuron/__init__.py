"""``torch.neuron``: the device API of the neuron backend, shaped like ``torch.cuda``.

Execution is host-synchronous: every op has completed when it returns, so
``synchronize()`` has nothing to wait for. Memory (``torch.neuron.memory``),
streams/events, device properties and RNG live in their own modules; the
instance they describe is ``torch_neuronx.runtime.topology``.
"""
import importlib
import os
import sys

import torch

from torch_neuronx.runtime import topology
from torch_neuronx.runtime import BACKEND_NAME
from torch_neuronx.runtime import ops as _ops
from torch_neuronx.neuron._device import (  # noqa: F401
    _get_device_index,
    current_device,
    device,
    device_count,
    device_of,
)
from torch_neuronx.neuron import memory  # noqa: F401
from torch_neuronx.neuron.memory import (  # noqa: F401
    empty_cache,
    get_per_process_memory_fraction,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from torch_neuronx.neuron.properties import (  # noqa: F401
    get_device_capability,
    get_device_name,
    get_device_properties,
)
from torch_neuronx.neuron.random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_neuronx.neuron.streams import (  # noqa: F401
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

__all__ = [
    # the device
    "current_device", "device", "device_count", "device_of", "init", "is_available", "is_initialized",
    "set_device", "synchronize",
    # memory
    "empty_cache", "get_per_process_memory_fraction", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    # properties and autocast
    "get_amp_supported_dtype", "get_device_capability", "get_device_name", "get_device_properties",
    "is_bf16_supported",
    # random numbers
    "get_rng_state", "get_rng_state_all", "initial_seed", "manual_seed", "manual_seed_all", "seed", "seed_all",
    "set_rng_state", "set_rng_state_all",
    # streams and events
    "Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream", "stream",
]

_in_bad_fork = False
_package = "torch_neuronx"  # the package whose set_device torch.neuron.set_device calls (install() names it)
# Names torch.neuron answers on behalf of higher layers (TorchNeuron's aliases), as
# name -> (module, attribute), imported on first use. Given by install(), so that this
# package imports nothing above it.
_aliases: dict[str, tuple[str, str]] = {}


def is_available() -> bool:
    """True when at least one neuron device is visible. Never initializes the runtime.
    False (not an error) when the environment's topology is invalid: see device_count()."""
    try:
        return device_count() > 0
    except topology.TopologyError:
        return False


def is_initialized() -> bool:
    """False until the first neuron tensor is created (or :func:`init` is called)."""
    return bool(_ops._is_initialized()) and not _in_bad_fork


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def _lazy_init() -> None:
    """Called by torch before the first neuron tensor is created."""
    _ops._device_count()  # the first use of a device: the core reads the visible cores now, if not yet
    if _in_bad_fork:
        raise RuntimeError(
            "Cannot re-initialize the neuron runtime in a forked subprocess. To use neuron with "
            "multiprocessing, you must use the 'spawn' start method "
            "(multiprocessing.set_start_method('spawn'), or torch.multiprocessing.spawn)."
        )
    if topology.error() is not None:
        raise RuntimeError(f"neuron is unusable: {topology.error()}")
    _ops._mark_initialized()


def init() -> None:
    """Initialize the neuron runtime now (it otherwise initializes on first use)."""
    _lazy_init()


def _after_fork_in_child() -> None:
    global _in_bad_fork
    if _ops._is_initialized():
        _in_bad_fork = True


def install(aliases: dict[str, tuple[str, str]], package: str) -> None:
    """Make this package ``torch.neuron``, with Tensor/Module/Storage methods for the device;
    ``aliases`` are names answered from higher layers (see ``_aliases``), ``package`` the module whose
    ``set_device`` torch.neuron.set_device calls (TorchNeuron's ``torch_neuronx``)."""
    global _package
    _package = package
    module = sys.modules[__name__]
    torch._register_device_module(BACKEND_NAME, module)
    # `import torch.neuron.memory` must find the same module objects, not load copies.
    for name in ("memory", "random", "streams", "properties"):
        sys.modules[f"torch.{BACKEND_NAME}.{name}"] = getattr(module, name)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _aliases.update(aliases)


def set_device(device) -> None:
    """Make ``device`` (an index or a torch.device; None: the current one) this thread's current
    device. As on TorchNeuron it goes through ``torch_neuronx.set_device``, so the index is checked
    there (ValueError) and a replacement of that name (a test's mock) is followed."""
    index = device.index if isinstance(device, torch.device) else device
    if index is None:
        index = current_device()
    _package_name("set_device")(index)


def _package_name(name: str):
    """``torch_neuronx.<name>``, looked up when called: install() names the package's module, which
    sits above this layer and is always imported before it."""
    return getattr(importlib.import_module(_package), name)


def synchronize(device=None) -> None:
    """Wait for all work on ``device``, in every stream. Execution is host-synchronous, so
    this only validates ``device``."""
    _get_device_index(device, optional=True, use="attached")


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float32, torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def __getattr__(name):
    if name == "default_generators":  # like torch.cuda.default_generators
        from torch_neuronx.neuron import random

        return random.default_generators
    if name in _aliases:
        module, attribute = _aliases[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")
