"""``torch.neuron``: the device API of the neuron backend, shaped like ``torch.cuda``.

Execution is host-synchronous: every op has completed when it returns, so
``synchronize()`` has nothing to wait for. Memory statistics, streams/events,
topology and device properties are provided by their own modules.
"""
import os

import torch

from torch_neuronx.neuron._device import (  # noqa: F401
    _get_device_index,
    current_device,
    device,
    device_count,
    device_of,
    set_device,
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

_ops = torch.ops.neuron
_in_bad_fork = False


def is_available() -> bool:
    """True when at least one neuron device is visible. Never initializes the runtime."""
    return device_count() > 0


def is_initialized() -> bool:
    """False until the first neuron tensor is created (or :func:`init` is called)."""
    return bool(_ops._is_initialized()) and not _in_bad_fork


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def _lazy_init() -> None:
    """Called by torch before the first neuron tensor is created."""
    if _in_bad_fork:
        raise RuntimeError(
            "Cannot re-initialize the neuron runtime in a forked subprocess. To use neuron with "
            "multiprocessing, you must use the 'spawn' start method "
            "(multiprocessing.set_start_method('spawn'), or torch.multiprocessing.spawn)."
        )
    _ops._mark_initialized()


def init() -> None:
    """Initialize the neuron runtime now (it otherwise initializes on first use)."""
    _lazy_init()


def _install_fork_handler() -> None:
    def after_fork_in_child():
        global _in_bad_fork
        if _ops._is_initialized():
            _in_bad_fork = True

    os.register_at_fork(after_in_child=after_fork_in_child)


def synchronize(device=None) -> None:
    """Wait for all work on ``device``. Execution is host-synchronous, so this only validates it."""
    _get_device_index(device, optional=True)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float32, torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def empty_cache() -> None:
    """Release cached memory. Freed neuron memory goes straight back to the host, so there is none."""


def get_device_name(device=None) -> str:
    _get_device_index(device, optional=True)
    return "NeuronCore-v3 (emulated on host)"


def __getattr__(name):
    if name == "default_generators":  # like torch.cuda.default_generators
        from torch_neuronx.neuron import random

        return random.default_generators
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")
