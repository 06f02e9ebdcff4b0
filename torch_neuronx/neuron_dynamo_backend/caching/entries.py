"""One compile cache entry on disk: its bytes, what makes it loadable, and where entries lie.

An entry is a header (magic, payload length, sha256 of the payload, MAC under the cache's key or
zeros) and the payload, in ``<dir>/<key[0:2]>/<key[2:4]>/<key>.neff``. A torn or damaged entry is
*corrupt* (its writer's process died, a disk flipped a bit): removed and recompiled. One that is
whole but may not be loaded (no MAC or a wrong one under a key; someone else's file in a directory
that should be yours alone) is *refused*: left in place, recompiled, and replaced by the next write.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import re
import stat
import struct
import time

from torch_neuronx.neuron_dynamo_backend.caching import signing, trust

MAGIC = b"NXNEFF02"
MAGIC_V1 = b"NXNEFF01"  # entries written before MACs: read as unsigned
_HEADER_V1 = struct.Struct("<8sQ32s")  # magic, payload length (little-endian u64), sha256(payload)
_HEADER = struct.Struct("<8sQ32s32s")  # the same, then the MAC under the key (zeros: unsigned)
HEADER_SIZE = _HEADER.size
_KEY_RE = re.compile(r"[0-9A-Za-z_-]{4,128}")  # keys become file names: no separators, no dots
Entry = collections.namedtuple("Entry", "key path size mtime")


class Unusable(Exception):
    """An entry that is not loaded: ``corrupt`` (torn or damaged: removed) or refused (kept)."""

    def __init__(self, reason: str, corrupt: bool):
        super().__init__(reason)
        self.corrupt = corrupt


def parts(key: str) -> tuple[str, str, str]:
    """The path of ``key``'s entry below the cache directory, as components."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"invalid compile cache key {key!r}")
    return key[0:2], key[2:4], key + ".neff"


def pack(key: str, payload: bytes, signing_key: signing.SigningKey | None) -> bytes:
    digest = hashlib.sha256(payload).digest()
    mac = signing_key.mac(key, digest) if signing_key is not None else signing.UNSIGNED
    return _HEADER.pack(MAGIC, len(payload), digest, mac) + payload


def unpack(data: bytes) -> tuple[bytes, bytes, bytes | None]:
    """(payload, its sha256, its MAC or None for an entry of the first format); raises Unusable."""
    header = _HEADER if data[:8] == MAGIC else _HEADER_V1
    if len(data) < header.size:
        raise Unusable(f"truncated header: {len(data)} bytes", corrupt=True)
    magic, length, digest, *mac = header.unpack_from(data)
    payload = data[header.size:]
    if magic not in (MAGIC, MAGIC_V1):
        raise Unusable(f"bad magic {magic!r}", corrupt=True)
    if len(payload) != length:
        raise Unusable(f"length mismatch: header says {length} bytes, file holds {len(payload)}", corrupt=True)
    if hashlib.sha256(payload).digest() != digest:
        raise Unusable("checksum mismatch", corrupt=True)
    return payload, digest, (mac[0] if mac else None)


def check(key: str, status: os.stat_result, digest: bytes, mac: bytes | None,
          signing_key: signing.SigningKey | None, private: bool) -> None:
    """Raise Unusable for a whole entry that may not be loaded: with a key, one whose MAC does not
    verify; without one, in a directory yours alone (``private``), a file someone else wrote."""
    if signing_key is not None:
        if mac is None or mac == signing.UNSIGNED:
            raise Unusable(f"it carries no MAC, and entries must be signed with the key from {signing_key.source}",
                           corrupt=False)
        if not signing_key.verifies(key, digest, mac):
            raise Unusable(f"its MAC does not verify under the key from {signing_key.source} (written with another "
                           f"key, or changed since)", corrupt=False)
    elif private and (status.st_uid != os.geteuid() or status.st_mode & 0o022):
        raise Unusable(f"it is {trust.who(status.st_uid)}'s, mode {stat.S_IMODE(status.st_mode):04o}, in a "
                       f"directory that should be yours alone", corrupt=False)


def shard_directories(directory: str) -> list[str]:
    """The two-character shard directories in ``directory`` (real directories only: a symlink is
    never followed, so listing or clearing cannot reach beyond the cache)."""
    try:
        return [item.path for item in os.scandir(directory)
                if len(item.name) == 2 and item.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def listing(directory: str) -> list[Entry]:
    """The entries in ``directory``, sorted by key: regular files two real shard directories below."""
    out = []
    for outer in shard_directories(directory):
        for inner in shard_directories(outer):
            with contextlib.suppress(OSError):  # removed meanwhile
                for item in os.scandir(inner):
                    if item.name.endswith(".neff") and not item.name.startswith(".") and \
                            item.is_file(follow_symlinks=False):
                        status = item.stat(follow_symlinks=False)
                        out.append(Entry(item.name[:-5], item.path, status.st_size, status.st_mtime))
    return sorted(out)


def remove_stale_temporaries(shard: str) -> None:
    """Temp files of writers that died mid-write; recent ones may belong to a live writer."""
    with contextlib.suppress(OSError):
        for item in os.scandir(shard):
            if item.name.startswith(".tmp-") and item.is_file(follow_symlinks=False) and \
                    time.time() - item.stat(follow_symlinks=False).st_mtime > 3600:
                with contextlib.suppress(OSError):
                    os.unlink(item.path)
