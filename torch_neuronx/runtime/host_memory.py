"""How much memory and disk this host can still give, and a clear refusal before a job that cannot fit.

The emulated NeuronCores live in host RAM, so a model that fits a NeuronCore can still be larger than
the machine. Linux would then kill the process part way (the OOM killer), losing the work and saying
nothing useful; ``require`` says so before anything is allocated. Available memory is the kernel's
estimate of what can be allocated without swapping (MemAvailable, which counts reclaimable page
cache), capped by the cgroup's limit when the process runs in a container with one.
"""
from __future__ import annotations

import os
import shutil

from torch_neuronx.runtime.units import format_bytes

MEMINFO = "/proc/meminfo"
CGROUP = "/sys/fs/cgroup"
# Left for everything else on the host (the interpreter, libraries, activations, other processes).
HEADROOM_FRACTION = 0.05


class HostMemoryError(MemoryError):
    """This host has too little memory (or disk) for what was asked; raised before allocating."""


def _kib_fields(path: str) -> dict[str, int]:
    """The "Key:  N kB" lines of a /proc file (meminfo, a process's status), in bytes."""
    values = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            fields = rest.split()
            if len(fields) == 2 and fields[1] == "kB":
                values[key] = int(fields[0]) * 1024
    return values


def _meminfo() -> dict[str, int]:
    return _kib_fields(MEMINFO)


def _cgroup_room() -> int | None:
    """Bytes left under the cgroup v2 limit, or None without one."""
    try:
        with open(os.path.join(CGROUP, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(CGROUP, "memory.current")) as f:
            return max(int(limit) - int(f.read()), 0)
    except (OSError, ValueError):
        return None


def total_bytes() -> int:
    return _meminfo()["MemTotal"]


def available_bytes() -> int:
    """What can still be allocated on this host without swapping or an OOM kill."""
    info = _meminfo()
    available = info.get("MemAvailable", info["MemFree"])
    room = _cgroup_room()
    return available if room is None else min(available, room)


def require(needed: int, what: str, fix: str) -> None:
    """Raise HostMemoryError unless ``needed`` bytes fit in what is available, less the headroom."""
    available = available_bytes()
    headroom = int(HEADROOM_FRACTION * total_bytes())
    if needed + headroom > available:
        raise HostMemoryError(
            f"{what} needs {format_bytes(needed)} of host memory, and this host has {format_bytes(available)} "
            f"available (of {format_bytes(total_bytes())}; {format_bytes(headroom)} is kept for everything "
            f"else). The emulated NeuronCores live in host RAM. To fix: {fix}.")


def require_disk(directory: str, needed: int, what: str, fix: str) -> None:
    """Raise HostMemoryError unless ``directory``'s file system has ``needed`` bytes free."""
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise HostMemoryError(f"{what} needs {format_bytes(needed)} of disk in {directory}, which has "
                              f"{format_bytes(free)} free. To fix: {fix}.")


def resident_bytes(pid: int | str = "self") -> tuple[int, int]:
    """A process's resident memory now (this one's by default): its own (RssAnon: what it wrote or allocated)
    and file pages (RssFile: a mapped checkpoint's, shared with every process mapping the same file)."""
    values = _kib_fields(f"/proc/{pid}/status")
    return values["RssAnon"], values["RssFile"]


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM): every byte it touched at once, file pages included."""
    peak = _kib_fields("/proc/self/status").get("VmHWM")
    if peak is None:
        raise OSError("no VmHWM in /proc/self/status")
    return peak
