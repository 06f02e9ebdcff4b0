"""The emulated Trainium instance: chips, NeuronCores, HBM, and which cores are visible.

Chosen by environment variables, read when torch_neuronx registers the device:

- ``TORCH_NEURONX_INSTANCE_TYPE`` (ours): the instance profile, default ``trn2.3xlarge``.
- ``NEURON_LOGICAL_NC_CONFIG`` (AWS runtime): physical NeuronCores per logical core,
  1 or 2 on Trn2/Trn3 (default 2); Trn1 has only 1.
- ``NEURON_RT_VISIBLE_CORES`` (AWS runtime): logical core ids this process sees,
  e.g. ``0-3``, ``2``, ``0,2``. ``neuron:0`` is the first of them.
- ``NEURON_RT_NUM_CORES`` (AWS runtime): how many cores this process takes (the first N).
- ``TORCH_NEURONX_DEVICE_MEMORY`` (ours): the emulated capacity of each logical core,
  e.g. ``2GiB``, ``512MB``, ``1073741824``; default: its HBM share minus the runtime's
  reservation. Host RAM stays the real limit.

Bad values raise :class:`TopologyError` naming the variable, its value and what is valid.
The instances and chips themselves are :mod:`.hardware`'s table.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from torch_neuronx.runtime.hardware import GiB, INSTANCES, MiB, Instance

INSTANCE_TYPE_ENV = "TORCH_NEURONX_INSTANCE_TYPE"
DEVICE_MEMORY_ENV = "TORCH_NEURONX_DEVICE_MEMORY"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
NUM_CORES_ENV = "NEURON_RT_NUM_CORES"
DEFAULT_INSTANCE_TYPE = "trn2.3xlarge"

# c10::DeviceIndex is int8: a process can index at most 127 devices of one type.
MAX_TORCH_DEVICES = 127


class TopologyError(ValueError):
    """An environment variable describes a topology the emulated instance cannot have."""


@dataclass(frozen=True)
class Topology:
    """One process's view of the emulated instance."""

    instance: Instance
    lnc: int
    visible_cores: tuple[int, ...]  # logical core ids; neuron:i is visible_cores[i]
    device_memory: int  # emulated capacity of each logical core, in bytes
    memory_overridden: bool = False
    # Under torchrun (after the first neuron group), TorchNeuron's numbering: the one visible core
    # is neuron:<local_rank>, and the node's local_world devices are numbered 0..local_world-1.
    local_rank: int | None = None
    local_world: int | None = None

    @property
    def device_count(self) -> int:
        return len(self.visible_cores) if self.local_world is None else self.local_world

    def core_of(self, index: int) -> int:
        """The logical core id behind ``neuron:index``: bound, another local rank's index is the core
        torchrun gives that rank (its LOCAL_RANK)."""
        if self.local_rank is None:
            return self.visible_cores[index]
        return self.visible_cores[0] if index == self.local_rank else index

    @property
    def logical_cores(self) -> int:
        return self.instance.logical_cores(self.lnc)

    @property
    def logical_cores_per_chip(self) -> int:
        return self.instance.chip.physical_cores // self.lnc

    def chip_of(self, core_id: int) -> int:
        return core_id // self.logical_cores_per_chip

    def connected_chips(self, chip: int) -> list[int]:
        """The chips wired to ``chip``: a 2D torus, or all of them behind a switch (Trn3)."""
        if self.instance.switched:
            return [other for other in range(self.instance.chips) if other != chip]
        if self.instance.torus is None:
            return []
        rows, cols = self.instance.torus
        r, c = divmod(chip, cols)
        neighbours = {((r - 1) % rows) * cols + c, ((r + 1) % rows) * cols + c,
                      r * cols + (c - 1) % cols, r * cols + (c + 1) % cols}
        neighbours.discard(chip)
        return sorted(neighbours)

    def describe(self) -> str:
        return f"an emulated {self.instance.name} (LNC={self.lnc})"


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
               "mib": MiB, "g": 1000**3, "gb": 1000**3, "gib": GiB, "t": 1000**4, "tb": 1000**4,
               "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, '1024' -> 1024. Raises ValueError."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(text)
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_core_list(text: str) -> list[int]:
    """'0-3' -> [0, 1, 2, 3]; '0,2' -> [0, 2]; '2' -> [2]. Raises ValueError."""
    cores: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if not match:
            raise ValueError(part)
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(part)
        cores.extend(range(first, last + 1))
    return cores


def _invalid(variable: str, value: str, valid: str) -> TopologyError:
    return TopologyError(f"{variable}={value!r} is invalid: {valid}.")


def from_env(environ=None, max_devices: int | None = MAX_TORCH_DEVICES) -> Topology:
    """The topology the environment asks for. Raises TopologyError for bad values, and when
    more than ``max_devices`` cores would be visible (None: no limit, for tools)."""
    env = os.environ if environ is None else environ
    instance = _instance(env)
    lnc = _lnc(env, instance)
    visible = _visible_cores(env, instance, lnc)
    if max_devices is not None and len(visible) > max_devices:
        raise TopologyError(
            f"{instance.name} with LNC={lnc} has {len(visible)} logical cores, but torch can index at most "
            f"{max_devices} devices of one type in a process. Set {VISIBLE_CORES_ENV} (e.g. '0-63') or "
            f"{NUM_CORES_ENV} to use fewer per process, as distributed runs do (one core per rank), "
            f"or use {LNC_ENV}=2.")
    memory, overridden = _device_memory(env, instance, lnc)
    return Topology(instance, lnc, tuple(visible), memory, overridden)


def _instance(env) -> Instance:
    name = env.get(INSTANCE_TYPE_ENV, "").strip() or DEFAULT_INSTANCE_TYPE
    if name not in INSTANCES:
        raise _invalid(INSTANCE_TYPE_ENV, name, "the emulated instance types are " + ", ".join(INSTANCES))
    return INSTANCES[name]


def _lnc(env, instance: Instance) -> int:
    text = env.get(LNC_ENV, "").strip()
    if not text:
        return instance.chip.lnc_values[0]
    valid = instance.chip.lnc_problem(int(text) if text.isdigit() else -1)
    if valid:
        raise _invalid(LNC_ENV, text, f"valid values on {instance.name} are {valid}")
    return int(text)


def _visible_cores(env, instance: Instance, lnc: int) -> list[int]:
    """NEURON_RT_VISIBLE_CORES, then NEURON_RT_NUM_CORES (the first N), over the instance's logical cores."""
    total = instance.logical_cores(lnc)
    core_range = f"logical core ids on {instance.name} with LNC={lnc} are 0 to {total - 1}"
    visible = list(range(total))
    visible_text = env.get(VISIBLE_CORES_ENV, "").strip()
    if visible_text:
        try:
            visible = parse_core_list(visible_text)
        except ValueError:
            raise _invalid(VISIBLE_CORES_ENV, visible_text,
                           f"expected a core id, a range or a comma-separated list such as '0-3', '2' or "
                           f"'0,2'; {core_range}") from None
        if any(core >= total for core in visible):
            raise _invalid(VISIBLE_CORES_ENV, visible_text, core_range)
        if len(set(visible)) != len(visible):
            raise _invalid(VISIBLE_CORES_ENV, visible_text, "a core is listed twice")
        visible = sorted(visible)
    num_text = env.get(NUM_CORES_ENV, "").strip()
    if not num_text:
        return visible
    available = len(visible)
    if not num_text.isdigit() or not 1 <= int(num_text) <= available:
        source = f"the {available} cores of {VISIBLE_CORES_ENV}={visible_text!r}" if visible_text \
            else f"the {available} logical cores of {instance.name} with LNC={lnc}"
        raise _invalid(NUM_CORES_ENV, num_text, f"valid values are 1 to {available} ({source})")
    if visible_text and int(num_text) != available:
        raise _invalid(NUM_CORES_ENV, num_text,
                       f"{VISIBLE_CORES_ENV}={visible_text!r} already selects {available} cores; "
                       "set only one of the two, or make them agree")
    return visible[: int(num_text)]


def _device_memory(env, instance: Instance, lnc: int) -> tuple[int, bool]:
    """(capacity of each logical core, whether TORCH_NEURONX_DEVICE_MEMORY set it)."""
    text = env.get(DEVICE_MEMORY_ENV, "").strip()
    if not text:
        return instance.chip.core_memory(lnc), False
    try:
        memory = parse_size(text)
    except ValueError:
        memory = 0
    if memory <= 0:
        raise _invalid(DEVICE_MEMORY_ENV, text, "expected a positive size in bytes, optionally with a unit, such "
                       "as '2GiB', '512MB' or '1073741824'")
    return memory, True


_current: Topology | None = None
_error: TopologyError | None = None


def refresh(environ=None) -> Topology | None:
    """Re-read the environment. Returns the topology, or None (see :func:`error`) if invalid."""
    global _current, _error
    try:
        _current, _error = from_env(environ), None
    except TopologyError as error:
        _current, _error = None, error
    return _current


def bind(local_rank: int, local_world: int) -> Topology:
    """This process's topology with TorchNeuron's numbering under torchrun (see Topology.local_rank)."""
    global _current
    _current = dataclasses.replace(current(), local_rank=local_rank, local_world=local_world)
    return _current


def error() -> TopologyError | None:
    """Why the environment's topology is invalid, or None."""
    return _error


def current() -> Topology:
    """This process's topology (read once). Raises TopologyError if the environment is invalid."""
    if _current is None and _error is None:
        refresh()
    if _error is not None:
        raise _error
    assert _current is not None
    return _current
