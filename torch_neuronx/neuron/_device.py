"""Device selection: which logical NeuronCore ``neuron`` means right now."""
import operator

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
_CHECKS = {"select": "_check_device_index", "attached": "_check_attached", "known": "_check_known_device",
           "unchecked": None}


def _get_device_index(device, optional: bool = False, use: str = "select") -> int:
    """The index of ``device`` (int, 'neuron:1', torch.device). None or 'neuron' give the
    current device when ``optional``. Raises ValueError for other device types, and for bad
    indices as checked for ``use`` (a key of _CHECKS; "unchecked": the caller checks)."""
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device index, got None")
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != BACKEND_NAME:
            raise ValueError(f"Expected neuron device, got {device.type}: pass a neuron device such as "
                             f"'neuron:0', its index, or None for the current device")
        if device.index is None:
            if not optional:
                raise ValueError(f"Expected a neuron device with an index, but got: {device}")
            return current_device()
        index = device.index
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise ValueError(f"Invalid device specification: {device!r}. Pass a device index (int), 'neuron:<i>' "
                         "or a torch.device")
    if _CHECKS[use] is not None:
        getattr(_ops, _CHECKS[use])(index)
    return index


def set_device(device: int) -> None:
    """``torch_neuronx.set_device``, as TorchNeuron's: make device index ``device`` this thread's
    current device, and the process's for threads that never chose one if no device was chosen yet
    (the first call wins). ``torch.neuron.set_device`` and ``torch.neuron.device`` go through it."""
    try:
        index = operator.index(device)
    except TypeError:
        raise TypeError(f"torch_neuronx.set_device expects a device index (int), got {device!r}, as on "
                        "TorchNeuron. Pass its index, or call torch.neuron.set_device with a torch.device.") from None
    count = device_count()
    if not 0 <= index < count:
        raise ValueError(f"Invalid device id: {index}. Valid range is 0 to {count - 1}. This process sees "
                         f"{count} neuron device(s) (NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES, read at the "
                         "first use of a device, choose them); use an index in that range.")
    try:
        _ops._select_device(index)
    except RuntimeError as error:  # under torchrun: another rank's index
        raise ValueError(str(error)) from None


class device:
    """Context manager that makes ``device`` current and restores the previous one (TorchNeuron's
    ``torch_neuronx.device``). The index is checked on entry: a bad one raises ValueError."""

    def __init__(self, device):
        self.idx = -1 if device is None else _get_device_index(device, optional=True, use="unchecked")
        self.prev_idx = -1

    def __enter__(self):
        if self.idx == -1:
            return self
        self.prev_idx = current_device()
        if self.prev_idx != self.idx:
            set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx not in (-1, self.idx):
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (no-op for CPU tensors)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == BACKEND_NAME else None)
