"""Inductor's CPU vector-ISA check, without a subprocess per probe in every new process.

Before it generates or loads host code, Inductor checks which vector ISAs (avx2, avx512,
avx512_vnni, avx512_bf16, ...) both the CPU and this torch build can use: it builds a small probe
library per ISA (kept in its cache) and, in every new process, starts a Python subprocess per probe
to ``dlopen`` it. The build is cached; the subprocesses are what a warm start pays.

While the neuron backend compiles or loads a graph (:func:`graph_cache.inductor_settings`), a probe
library that already loaded successfully is not loaded again in a subprocess if a record in the
NEFF cache says so. Inductor's own decision logic still runs (which ISAs the CPU reports, which
probe libraries to build, which extensions to test); only the subprocess's answer is remembered.
A record names the probe library by its content (sha256) and the environment that loaded it
(torch build, Python executable, loader path, kernel, libc, the CPU's model and flags), so a record
written on another machine, by another Python or torch, or for a rebuilt library is never trusted.
Only successful loads are recorded: a failed probe runs again next time. A record that does not
read back exactly as written (torn, edited, from another format) is ignored, the probe runs, and
the record is rewritten. Inductor's configuration is not touched, so its cache keys are the same
with or without a record, and Inductor compiles outside the neuron backend probe as before.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import os
import platform
import sys
import threading

from torch_neuronx.neuron_dynamo_backend.caching import neff_cache, safe_files, trust

# Bump when what a record vouches for changes.
RECORD_FORMAT = "1"
RECORD_SUBDIR = "vec_isa_probes"  # under the NEFF cache's inductor/ directory: `neuron-cache clear` removes it

_active: contextvars.ContextVar[bool] = contextvars.ContextVar("neuron_isa_probe_records", default=False)
_install_lock = threading.Lock()
_original_probe_load = None

# Probes answered in this process from a record, and probes run (tests read these).
counters = {"remembered": 0, "probed": 0}
# The probe libraries that loaded in this process: a graph's entry carries them (:mod:`.libraries`),
# so that a new working cache need not build them.
loaded_libraries: set[str] = set()


@functools.cache
def cpu_description() -> str:
    """The CPU's model name and feature flags, as the kernel reports them."""
    model, flags = "", ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "model name" and not model:
                    model = value.strip()
                elif name in ("flags", "Features", "features") and not flags:
                    flags = " ".join(sorted(value.split()))
                if model and flags:
                    break
    return f"{platform.machine()}|{model}|{flags}"


def _environment(probe_env: dict) -> list[str]:
    """Everything besides the library's bytes that decides whether the probe's dlopen succeeds."""
    import torch

    return [torch.__version__, os.path.dirname(torch.__file__), sys.executable, sys.version,
            probe_env.get("LD_LIBRARY_PATH", ""), platform.release(), repr(platform.libc_ver()),
            cpu_description()]


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _record(isa, output_path: str) -> tuple[str, list[str], bytes] | None:
    """(directory, path below it, expected content) of the record for this probe library here, or
    None when the cache is off or keeps no working cache."""
    cache = neff_cache.get_cache()
    directory = cache.inductor_directory() if cache.enabled else None
    if directory is None:
        return None
    environment = _environment(isa._build_probe_env())
    library = _sha256(output_path)
    key = neff_cache.cache_key("vec-isa-probe", RECORD_FORMAT, library, *environment)
    content = "\n".join([f"torch_neuronx vec-isa probe record {RECORD_FORMAT}", f"library {library}",
                         *environment]).encode("utf-8") + b"\n"
    return directory, [RECORD_SUBDIR, key + ".ok"], content


def _recorded(directory: str, parts: list[str], content: bytes) -> bool:
    try:
        data, _ = safe_files.read_file(directory, parts)
    except (OSError, ValueError):
        return False
    return data == content


def _remembering_probe_load(self, output_path: str) -> bool:
    if not _active.get():
        return _original_probe_load(self, output_path)
    try:
        record = _record(self, output_path)
    except OSError:  # the library vanished or cannot be read: let Inductor's probe decide
        record = None
    if record is not None and _recorded(*record):
        counters["remembered"] += 1
        loaded_libraries.add(output_path)
        return True
    counters["probed"] += 1
    loaded = _original_probe_load(self, output_path)
    if loaded:
        loaded_libraries.add(output_path)
    if loaded and record is not None:
        with contextlib.suppress(OSError):  # an unwritable cache only costs the next process a probe
            trust.make_directory(record[0])
            safe_files.write_file(*record, mode=0o600, directory_mode=trust.PRIVATE_DIRECTORY_MODE)
    return loaded


def _install() -> bool:
    """Wrap Inductor's probe once per process. False if this torch has no such probe."""
    global _original_probe_load
    with _install_lock:
        if _original_probe_load is not None:
            return True
        try:
            from torch._inductor.cpu_vec_isa import VecISA
        except ImportError:
            return False
        original = getattr(VecISA, "_probe_load", None)
        if original is None or not hasattr(VecISA, "_build_probe_env"):
            return False
        _original_probe_load = original
        VecISA._probe_load = _remembering_probe_load
        return True


@contextlib.contextmanager
def remembered_probes():
    """Within this context (this thread or task only), Inductor's ISA probes use the records."""
    if not _install():
        yield
        return
    token = _active.set(True)
    try:
        yield
    finally:
        _active.reset(token)
