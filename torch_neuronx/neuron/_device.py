"""Device selection: which logical NeuronCore ``neuron`` means right now."""
import torch

from torch_neuronx.runtime import topology
from torch_neuronx.runtime import BACKEND_NAME
from torch_neuronx.runtime import ops as _ops



def device_count() -> int:
    """Number of visible logical NeuronCores. Raises topology.TopologyError, naming the
    variable, when the environment (NEURON_RT_VISIBLE_CORES, ...) is invalid."""
    count = int(_ops._device_count())
    if count == 0 and topology.error() is not None:
        raise topology.error()
    return count


def current_device() -> int:
    return int(_ops._current_device())


# How an index is checked, by what the caller does with it (csrc/neuron.h). Outside torchrun all three
# accept 0..count-1. Under torchrun: "select" (make it current) and "attached" (its streams and
# memory) accept only this process's core, neuron:<LOCAL_RANK>; "known" (statistics, generators,
# properties) any index of the node.
_CHECKS = {"select": "_check_device_index", "attached": "_check_attached", "known": "_check_known_device"}


def _get_device_index(device, optional: bool = False, use: str = "select") -> int:
    """The index of ``device`` (int, 'neuron:1', torch.device). None or 'neuron' give the
    current device when ``optional``. Raises for other device types and bad indices (checked
    for ``use``, a key of _CHECKS)."""
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device index, got None")
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != BACKEND_NAME:
            raise ValueError(f"Expected a neuron device, but got: {device}")
        if device.index is None:
            if not optional:
                raise ValueError(f"Expected a neuron device with an index, but got: {device}")
            return current_device()
        index = device.index
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise TypeError(f"Expected a neuron device (int, str or torch.device), but got {device!r}")
    getattr(_ops, _CHECKS[use])(index)
    return index


def set_device(device) -> None:
    """Make ``device`` the current neuron device of this thread."""
    index = _get_device_index(device)
    _ops._set_device(index)


class device:
    """Context manager that makes ``device`` current and restores the previous one."""

    def __init__(self, device):
        self.index = -1 if device is None else _get_device_index(device, optional=True)
        self.previous = -1

    def __enter__(self):
        self.previous = current_device()
        if self.index >= 0 and self.index != self.previous:
            _ops._set_device(self.index)
        return self

    def __exit__(self, *exc):
        if self.previous != current_device():
            _ops._set_device(self.previous)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (no-op for CPU tensors)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == BACKEND_NAME else None)
