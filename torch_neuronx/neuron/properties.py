"""What each neuron device is: name, memory, NeuronCore architecture, place in the instance."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_neuronx.runtime import BACKEND_NAME, topology
from torch_neuronx.neuron._device import _get_device_index, device_count

__all__ = ["NeuronDeviceProperties", "get_device_capability", "get_device_name", "get_device_properties"]


@dataclass(frozen=True)
class NeuronDeviceProperties:
    """``torch.neuron.get_device_properties(i)``: the logical NeuronCore behind ``neuron:i``. ``name``
    and ``total_memory`` are TorchNeuron's; the rest describe the emulated core."""

    name: str  # the instance family, as TorchNeuron names it: "trn2"
    total_memory: int  # bytes: the emulated capacity (HBM share minus the runtime's reservation)
    major: int  # NeuronCore architecture version, e.g. 3 for NeuronCore-v3
    minor: int
    core_id: int  # logical core id on the instance (NEURON_RT_VISIBLE_CORES numbering)
    physical_core_count: int  # physical NeuronCores in this logical core (= the LNC)
    logical_nc_config: int
    chip: str  # "Trainium2"
    core_arch: str  # "NeuronCore-v3"
    chip_index: int  # which chip of the instance holds this core
    instance_type: str  # "trn2.3xlarge"
    emulated: bool = True  # executes on the host CPU

    def __repr__(self) -> str:
        return (f"_NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
                f"core='{self.chip} {self.core_arch}', core_id={self.core_id}, "
                f"logical_nc_config={self.logical_nc_config}, chip_index={self.chip_index}, "
                f"instance_type='{self.instance_type}', emulated=True)")


def _properties_index(device) -> int:
    """TorchNeuron's reading of ``device``: None (current), an index, 'neuron:<i>' or a torch.device.
    An index outside the node's devices is ValueError("Invalid device id: <i>")."""
    if device is None or isinstance(device, torch.device) or (isinstance(device, str) and BACKEND_NAME in device):
        index = _get_device_index(device, optional=True, use="unchecked")
    else:
        index = int(device)
    count = device_count()
    if not 0 <= index < count:
        raise ValueError(f"Invalid device id: {index}. This process sees {count} neuron device(s), "
                         f"0 to {count - 1}.")
    _get_device_index(index, use="known")
    return index


def get_device_properties(device=None) -> NeuronDeviceProperties:
    """The properties of ``device`` (default: the current device): as on TorchNeuron, ``name`` is the
    instance family ("trn2") and ``total_memory`` the core's memory in bytes."""
    index = _properties_index(device)
    topo = topology.current()
    chip = topo.instance.chip
    core = topo.core_of(index)
    return NeuronDeviceProperties(
        name=topo.instance.family, total_memory=topo.device_memory,
        major=chip.capability[0], minor=chip.capability[1], core_id=core,
        physical_core_count=topo.lnc, logical_nc_config=topo.lnc, chip=chip.name, core_arch=chip.core_arch,
        chip_index=topo.chip_of(core), instance_type=topo.instance.name)


def get_device_name(device=0) -> str:
    """TorchNeuron's name of a device: ``"neuron:<i>"`` for an index (default 0), ``str(device)`` for a
    torch.device. Anything else is a ValueError, as there."""
    if isinstance(device, torch.device):
        return str(device)
    if isinstance(device, int) and not isinstance(device, bool):
        return f"{BACKEND_NAME}:{device}"
    raise ValueError(f"Incorrect device argument found, expected torch.device or int type, found {type(device)}. "
                     f"Pass an index or torch.device('{BACKEND_NAME}:<i>'); for the chip and core, see "
                     "torch.neuron.get_device_properties(i).chip and .core_arch.")


def get_device_capability(device=None) -> tuple[int, int]:
    """The NeuronCore architecture as (major, minor): (3, 0) for NeuronCore-v3 (Trainium2)."""
    props = get_device_properties(device)
    return props.major, props.minor
