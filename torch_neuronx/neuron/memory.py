"""``torch.neuron.memory`` and ``torch_neuronx.memory_*``: device memory statistics and limits, as TorchNeuron's.

Every byte a neuron tensor owns is counted per device, including results adopted from CPU kernels.
:func:`memory_stats` is TorchNeuron's nested dictionary (``allocated_bytes`` -> ``current``, ``peak``,
``allocated``, ``freed``; ``num_ooms``, ...). Freed memory goes straight back to the host: nothing is
cached, so *reserved* memory (TorchNeuron's "held in cache for reuse") is 0, as on TorchNeuron, and
:func:`empty_cache` has nothing to release. Each device has the emulated capacity of its logical
NeuronCore (``TORCH_NEURONX_DEVICE_MEMORY`` overrides it); going beyond it raises
``torch.OutOfMemoryError`` and leaves every existing tensor intact. ``torch.accelerator``'s memory API
reads the same counters in torch's own flat format (``"allocated_bytes.all.current"``, ...).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from torch_neuronx.neuron._device import _get_device_index
from torch_neuronx.runtime import format_bytes
from torch_neuronx.runtime import ops as _ops

__all__ = [
    "empty_cache", "get_per_process_memory_fraction", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]

_POOLS = ("all", "small_pool", "large_pool")
_FIELDS = ("current", "peak", "allocated", "freed")


class _DeviceMemory(NamedTuple):
    """One device's counters, as the core keeps them."""
    bytes: dict[str, dict[str, int]]  # pool -> field -> bytes
    blocks: dict[str, dict[str, int]]  # pool -> field -> allocations
    num_ooms: int
    capacity: int  # the emulated device memory
    limit: int  # what this process may use (set_per_process_memory_fraction)


def _device_memory(device) -> _DeviceMemory:
    values = list(_ops._memory_stats(_get_device_index(device, optional=True, use="known")))
    groups = []
    for _ in ("bytes", "blocks"):
        pools = {}
        for pool in _POOLS:
            pools[pool] = dict(zip(_FIELDS, values[:4]))
            del values[:4]
        groups.append(pools)
    return _DeviceMemory(*groups, *values)


def memory_stats(device=None) -> dict[str, Any]:
    """TorchNeuron's statistics of ``device`` (default: the current device): ``allocated_bytes``,
    ``reserved_bytes`` and ``active_bytes``, each ``{"current", "peak", "allocated", "freed"}`` in
    bytes, then the counters ``num_alloc_retries``, ``num_ooms``, ``num_tensor_frees`` and
    ``allocation_requests``. Nothing is cached, so ``reserved_bytes`` is all zeros and
    ``active_bytes`` equals ``allocated_bytes``."""
    stats = _device_memory(device)
    blocks = stats.blocks["all"]
    return {
        "allocated_bytes": dict(stats.bytes["all"]),
        "reserved_bytes": dict.fromkeys(_FIELDS, 0),
        "active_bytes": dict(stats.bytes["all"]),
        "num_alloc_retries": 0,  # no cache to flush and retry
        "num_ooms": stats.num_ooms,
        "num_tensor_frees": blocks["freed"],
        "allocation_requests": blocks["allocated"],
    }


def memory_allocated(device=None) -> int:
    """Bytes currently owned by neuron tensors on ``device``."""
    return _device_memory(device).bytes["all"]["current"]


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or :func:`reset_peak_memory_stats`."""
    return _device_memory(device).bytes["all"]["peak"]


def memory_reserved(device=None) -> int:
    """Bytes held in a cache for reuse: 0, as on TorchNeuron (freed memory goes straight back)."""
    return memory_stats(device)["reserved_bytes"]["current"]


def max_memory_reserved(device=None) -> int:
    """Peak of :func:`memory_reserved`: 0."""
    return memory_stats(device)["reserved_bytes"]["peak"]


def reset_peak_memory_stats(device=None) -> None:
    """Make every ``peak`` statistic its ``current`` value."""
    _ops._reset_peak_memory_stats(_get_device_index(device, optional=True, use="known"))


def reset_max_memory_allocated(device=None) -> None:
    """Same as :func:`reset_peak_memory_stats` (torch.cuda keeps this older name too)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Zero the ``allocated``/``freed`` totals and the counters (``num_ooms``, ``num_tensor_frees``,
    ``allocation_requests``)."""
    _ops._reset_accumulated_memory_stats(_get_device_index(device, optional=True, use="known"))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device's emulated memory."""
    stats = _device_memory(device)
    return max(stats.capacity - stats.bytes["all"]["current"], 0), stats.capacity


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Let this process allocate at most ``fraction`` of the device's memory; beyond it,
    allocations raise ``torch.OutOfMemoryError`` as on CUDA."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction!r}. Allowed range: 0~1")
    index = _get_device_index(device, optional=True, use="known")
    _ops._set_memory_limit(index, int(fraction * _device_memory(index).capacity))


def get_per_process_memory_fraction(device=None) -> float:
    stats = _device_memory(device)
    return stats.limit / stats.capacity


def empty_cache() -> None:
    """Release cached memory. Freed neuron memory goes straight back to the host, so there is none."""


_RULE, _THICK = "-" * 75, "=" * 75


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """TorchNeuron's printable summary of :func:`memory_stats`, headed "Neuron Memory Summary, Device
    <i>"; the full one adds the emulated capacity and what this process may use of it."""
    index = _get_device_index(device, optional=True, use="known")
    stats = memory_stats(index)
    lines = [_THICK, f"  Neuron Memory Summary, Device {index}", _THICK,
             f"  Allocations: {stats['allocation_requests']:,}  |  Frees: {stats['num_tensor_frees']:,}",
             f"  OOMs: {stats['num_ooms']:,}  |  Alloc Retries: {stats['num_alloc_retries']:,}"]
    if not abbreviated:
        memory = _device_memory(index)
        lines.append(f"  Emulated capacity: {format_bytes(memory.capacity)}  |  "
                     f"This process may use: {format_bytes(memory.limit)}")
    lines += [_THICK, "  Metric              | Current    | Peak       | Allocated  | Freed", _RULE]
    for title, key in (("Allocated Memory", "allocated_bytes"), ("Reserved Memory", "reserved_bytes"),
                       ("Active Memory", "active_bytes")):
        values = [format_bytes(stats[key][field]) for field in _FIELDS]
        lines.append(f"  {title:<18} | {values[0]:>10} | {values[1]:>10} | {values[2]:>10} | {values[3]:>10}")
    lines.append(_THICK)
    return "\n".join(lines)
