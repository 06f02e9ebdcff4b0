"""``torch.neuron.memory``: device memory statistics and limits, shaped like ``torch.cuda.memory``.

Every byte a neuron tensor owns is counted per device, including results adopted
from CPU kernels. Freed memory goes straight back to the host: there is no
cache, so *reserved* equals *allocated* and :func:`empty_cache` has nothing to
release. Each device has the emulated capacity of its logical NeuronCore
(``TORCH_NEURONX_DEVICE_MEMORY`` overrides it); going beyond it raises
``torch.OutOfMemoryError`` and leaves every existing tensor intact.
"""
from __future__ import annotations

import collections
from typing import Any, NamedTuple

import torch

from torch_neuronx.neuron._device import _get_device_index
from torch_neuronx.runtime import format_bytes
from torch_neuronx.runtime import ops as _ops

__all__ = [
    "empty_cache", "get_per_process_memory_fraction", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats", "set_per_process_memory_fraction",
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


def memory_stats_as_nested_dict(device=None) -> dict[str, Any]:
    """:func:`memory_stats` before flattening, as torch.cuda's."""
    stats = _device_memory(device)
    zero = {pool: dict.fromkeys(_FIELDS, 0) for pool in _POOLS}
    # No caching allocator: each block is its own segment, active while allocated, never split.
    return {
        "allocated_bytes": stats.bytes, "reserved_bytes": stats.bytes,
        "active_bytes": stats.bytes, "requested_bytes": stats.bytes,
        "inactive_split_bytes": zero,
        "allocation": stats.blocks, "segment": stats.blocks, "active": stats.blocks,
        "inactive_split": zero,
        "oversize_allocations": dict.fromkeys(_FIELDS, 0), "oversize_segments": dict.fromkeys(_FIELDS, 0),
        "num_alloc_retries": 0, "num_ooms": stats.num_ooms, "num_sync_all_streams": 0,
        "num_device_alloc": stats.blocks["all"]["allocated"],
        "num_device_free": stats.blocks["all"]["freed"],
        "max_split_size": -1,
    }


def memory_stats(device=None) -> dict[str, Any]:
    """The device's memory statistics, with the keys of ``torch.cuda.memory_stats``
    (``"allocated_bytes.all.current"``, ``"num_ooms"``, ...), sorted."""
    flat: list[tuple[str, Any]] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat.append((prefix, value))

    walk("", memory_stats_as_nested_dict(device))
    return collections.OrderedDict(sorted(flat))


def memory_allocated(device=None) -> int:
    """Bytes currently owned by neuron tensors on ``device``."""
    return _device_memory(device).bytes["all"]["current"]


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or :func:`reset_peak_memory_stats`."""
    return _device_memory(device).bytes["all"]["peak"]


def memory_reserved(device=None) -> int:
    """Bytes held for the device. Equal to :func:`memory_allocated`: freed memory is not cached."""
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None) -> None:
    """Make every ``peak`` statistic its ``current`` value."""
    _ops._reset_peak_memory_stats(_get_device_index(device, optional=True, use="known"))


def reset_max_memory_allocated(device=None) -> None:
    """Same as :func:`reset_peak_memory_stats` (torch.cuda keeps this older name too)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Zero the ``allocated``/``freed`` totals and ``num_ooms``."""
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


def _format_count(count: int) -> str:
    for unit in (" ", "K", "M"):
        if abs(count) < 1000 or unit == "M":
            return f"{count:7d} {unit}" if unit == " " else f"{count:7.0f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of :func:`memory_stats`, laid out like ``torch.cuda.memory_summary``."""
    index = _get_device_index(device, optional=True, use="known")
    stats = memory_stats_as_nested_dict(index)
    device_memory = _device_memory(index)
    rows = [("allocated_bytes", "Allocated memory", format_bytes),
            ("active_bytes", "Active memory", format_bytes),
            ("requested_bytes", "Requested memory", format_bytes),
            ("reserved_bytes", "Device reserved memory", format_bytes),
            ("allocation", "Allocations", _format_count),
            ("active", "Active allocs", _format_count),
            ("segment", "Device reserved segments", _format_count)]
    width = 75
    rule, thick = "|" + "-" * width + "|", "|" + "=" * width + "|"

    def line(text: str) -> str:
        return f"|{text:<{width}}|"

    lines = [thick, line(f" PyTorch neuron memory summary, device ID {index}"),
             line(f" emulated capacity {format_bytes(device_memory.capacity)}, this process may use "
                  f"{format_bytes(device_memory.limit)}"),
             line(f" num_ooms: {stats['num_ooms']}   (no caching: reserved equals allocated)"),
             thick,
             f"|{'        Metric         ':<25}|{' Cur Usage ':^12}|{' Peak Usage ':^12}|{' Tot Alloc ':^11}|"
             f"{' Tot Freed ':^12}|",
             rule]
    for key, title, fmt in rows:
        pools = ("all",) if abbreviated else _POOLS
        for pool in pools:
            values = stats[key][pool]
            label = title if pool == "all" else f"      from {pool.replace('_pool', '')} pool"
            lines.append(f"|{label:<25}|{fmt(values['current']):>12}|{fmt(values['peak']):>12}|"
                         f"{fmt(values['allocated']):>11}|{fmt(values['freed']):>12}|")
        lines.append(rule)
    lines.append(thick)
    return "\n".join(lines) + "\n"
