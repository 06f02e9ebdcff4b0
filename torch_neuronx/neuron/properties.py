"""What each neuron device is: name, memory, NeuronCore architecture, place in the instance."""
from __future__ import annotations

from dataclasses import dataclass

from torch_neuronx.runtime import topology
from torch_neuronx.neuron._device import _get_device_index

__all__ = ["NeuronDeviceProperties", "get_device_capability", "get_device_name", "get_device_properties"]


@dataclass(frozen=True)
class NeuronDeviceProperties:
    """``torch.neuron.get_device_properties(i)``: the logical NeuronCore behind ``neuron:i``."""

    name: str  # "Trainium2 NeuronCore-v3"
    total_memory: int  # bytes: the emulated capacity (HBM share minus the runtime's reservation)
    major: int  # NeuronCore architecture version, e.g. 3 for NeuronCore-v3
    minor: int
    core_id: int  # logical core id on the instance (NEURON_RT_VISIBLE_CORES numbering)
    physical_core_count: int  # physical NeuronCores in this logical core (= the LNC)
    logical_nc_config: int
    chip: str  # "Trainium2"
    chip_index: int  # which chip of the instance holds this core
    instance_type: str  # "trn2.3xlarge"
    emulated: bool = True  # executes on the host CPU

    def __repr__(self) -> str:
        return (f"_NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
                f"core_id={self.core_id}, logical_nc_config={self.logical_nc_config}, chip_index={self.chip_index}, "
                f"instance_type='{self.instance_type}', emulated=True)")


def get_device_properties(device=None) -> NeuronDeviceProperties:
    index = _get_device_index(device, optional=True, use="known")
    topo = topology.current()
    chip = topo.instance.chip
    core = topo.core_of(index)
    return NeuronDeviceProperties(
        name=f"{chip.name} {chip.core_arch}", total_memory=topo.device_memory,
        major=chip.capability[0], minor=chip.capability[1], core_id=core,
        physical_core_count=topo.lnc, logical_nc_config=topo.lnc, chip=chip.name,
        chip_index=topo.chip_of(core), instance_type=topo.instance.name)


def get_device_name(device=None) -> str:
    """E.g. "Trainium2 NeuronCore-v3"."""
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple[int, int]:
    """The NeuronCore architecture as (major, minor): (3, 0) for NeuronCore-v3 (Trainium2)."""
    props = get_device_properties(device)
    return props.major, props.minor
