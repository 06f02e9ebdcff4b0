"""The host libraries a compiled graph loads, carried with its cache entry.

Inductor builds each graph's C++ kernels, and once per working cache its vector-ISA probes, with
g++ into its working cache. Its cache artifacts (what a graph's entry holds) keep the generated
source, not the built libraries, so a new working cache (a second machine, a CI runner that
restored a compile cache) would build them all again. While a graph compiles, the C++ sources
Inductor writes are noted (:func:`noting_sources`); the libraries built from them are stored as
entries of their own, named by their sha256 (one copy however many graphs load it), and the
graph's entry lists each with its path in the working cache and its sha256, so that the entry's
checksum and MAC cover them. Before a stored graph is loaded, each of its libraries missing from
the working cache is written there (:func:`restore`), once its bytes match the sha256 listed.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import struct
import threading

from torch_neuronx.neuron_dynamo_backend.caching import isa_probe, neff_cache, safe_files

_MAGIC = b"NXGRAPH1"
_LENGTH = struct.Struct("<I")
_noted: contextvars.ContextVar[list | None] = contextvars.ContextVar("neuron_noted_sources", default=None)
_install_lock = threading.Lock()
_original_write = None


def _noting_write(content, extension: str, *args, **kwargs):
    basename, path = _original_write(content, extension, *args, **kwargs)
    sources = _noted.get()
    if sources is not None and extension.endswith("cpp"):
        sources.append(path)
    return basename, path


def _install() -> bool:
    """Wrap Inductor's code writer once per process. False if this torch has none."""
    global _original_write
    with _install_lock:
        if _original_write is None:
            from torch._inductor import codecache

            if not callable(getattr(codecache, "write", None)):
                return False
            _original_write = codecache.write
            codecache.write = _noting_write
        return True


@contextlib.contextmanager
def noting_sources():
    """Within this block (this thread), the C++ sources Inductor writes are listed in the list yielded."""
    sources: list[str] = []
    if not _install():
        yield sources
        return
    token = _noted.set(sources)
    try:
        yield sources
    finally:
        _noted.reset(token)


def _library_key(digest: str) -> str:
    return neff_cache.cache_key("host library", digest)


def store(cache: neff_cache.NeffCache, sources: list[str], working: str) -> list[list[str]]:
    """Store the libraries built from ``sources`` (and the ISA probes of this process) in the
    working cache ``working``; returns their list [path in ``working``, sha256]."""
    listed = []
    for source in dict.fromkeys([*sources, *isa_probe.loaded_libraries]):
        library = os.path.splitext(source)[0] + ".so"
        relative = os.path.relpath(library, working)
        if relative.startswith(os.pardir) or not os.path.isfile(library) or os.path.islink(library):
            continue
        with open(library, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        if not cache.contains(_library_key(digest)):
            cache.put(_library_key(digest), data, remember=False)
        listed.append([relative, digest])
    return listed


def restore(cache: neff_cache.NeffCache, listed: list[list[str]], working: str) -> int:
    """Write each listed library missing from ``working`` there; returns how many were written. One
    whose bytes cannot be had, or do not match, is left for Inductor to build."""
    written = 0
    for relative, digest in listed:
        parts = relative.split("/")
        if os.path.lexists(os.path.join(working, *parts)):
            continue  # built or restored before: the working cache is yours alone
        data = cache.get(_library_key(digest), remember=False)
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            continue
        with contextlib.suppress(OSError, ValueError):
            safe_files.write_file(working, parts, data, 0o700, 0o700)
            written += 1
    return written


def pack(artifacts: bytes, listed: list[list[str]]) -> bytes:
    """A graph's entry: Inductor's cache artifacts and the list of its libraries."""
    manifest = json.dumps(listed).encode()
    return _MAGIC + _LENGTH.pack(len(manifest)) + manifest + artifacts


def unpack(payload: bytes) -> tuple[bytes, list[list[str]]]:
    """(Inductor's cache artifacts, the list of libraries) of a graph's entry; ValueError if it is none."""
    if payload[:len(_MAGIC)] != _MAGIC:
        raise ValueError("not a graph entry of this format")
    start = len(_MAGIC) + _LENGTH.size
    (length,) = _LENGTH.unpack_from(payload, len(_MAGIC))
    listed = json.loads(payload[start:start + length])
    if not all(isinstance(item, list) and len(item) == 2 and all(isinstance(s, str) for s in item)
               for item in listed):
        raise ValueError("the list of libraries is malformed")
    return payload[start + length:], listed
