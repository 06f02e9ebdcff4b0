"""Persistent, process-safe compile-artifact cache, shaped like AWS TorchNeuron's NEFF cache.

The torch.compile backend stores opaque bytes here (serialized compiled graphs) under a key
built with `cache_key(...)`. Two tiers: an in-memory LRU in front of an on-disk directory of
entries sharded as `<dir>/<key[0:2]>/<key[2:4]>/<key>.neff`. Entries carry a header (magic,
length, sha256) so a torn or corrupt file is detected, removed and recompiled, never loaded.
Writes are atomic (temp file + fsync + os.replace); `compile_lock(key)` is an advisory
per-key file lock so that N processes compiling the same graph compile it once.

Environment (names as in AWS's docs):
  TORCH_NEURONX_NEFF_CACHE_DIR           cache directory (default /tmp/neff_cache)
  TORCH_NEURONX_NEFF_DISABLE_CACHE       1/true/yes/on: disable both tiers
  NEURON_COMPILATION_CACHE_MAX_SIZE_MB   in-memory tier budget in MiB (default 512)
  NEURON_COMPILATION_CACHE_MAX_ENTRIES   in-memory tier entry limit (default 1024)
  TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR     where per-key lock files live (default /tmp/local_cache)
  TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT  seconds to wait for a compile lock (default 1200)
  TORCH_NEURONX_LOG_LEVEL                >= 2 prints HIT/MISS/Storing lines to stderr (default 1)

Differences from AWS: the entries hold Inductor-compiled host code, not NEFFs (the `.neff`
name is kept for layout compatibility), and keys are blake2b-128 digests rather than XXH3-128.

``neuron-cache [--dir PATH] {list,size,clear}`` (:mod:`torch_neuronx.neuron_cache`) inspects it.
"""
import collections
import contextlib
import glob
import hashlib
import os
import re
import shutil
import struct
import sys
import tempfile
import threading
import time

try:
    import fcntl
except ImportError:  # not POSIX: compile without the cross-process lock
    fcntl = None

from torch_neuronx.runtime import env_flag, env_number, warn_once

MAGIC = b"NXNEFF01"
# Where the compile backend keeps Inductor's own cache (generated code, built libraries).
INDUCTOR_SUBDIR = "inductor"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length (little-endian u64), sha256(payload)
_KEY_RE = re.compile(r"[0-9A-Za-z_-]{4,128}")  # keys become file names: no separators, no dots
COUNTER_NAMES = ("InMemoryHits", "InMemoryMisses", "PersistentHits", "PersistentMisses",
                 "Evictions", "TotalCompilations", "CorruptEntries", "WriteFailures")
Entry = collections.namedtuple("Entry", "key path size mtime")
DISABLE_ENV = "TORCH_NEURONX_NEFF_DISABLE_CACHE"


def _disabled() -> bool:
    return env_flag(DISABLE_ENV, default=False)


def _log(message: str) -> None:
    # Read at call time: tests and users flip the level per process.
    if env_number("TORCH_NEURONX_LOG_LEVEL", 1) >= 2:
        print(f"[NEFF_CACHE] {message}", file=sys.stderr, flush=True)


def cache_key(*parts) -> str:
    """A 32-hex-char digest of `parts` (str or bytes). AWS uses XXH3-128; we use blake2b-128
    (stdlib). Each part is length-prefixed so ('ab', 'c') and ('a', 'bc') differ."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, str):
            part = part.encode("utf-8")
        elif not isinstance(part, (bytes, bytearray, memoryview)):
            raise TypeError(f"cache_key parts must be str or bytes, not {type(part).__name__}")
        part = bytes(part)
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    return h.hexdigest()


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one (concurrent
    writers: last wins). Creates the directory; raises OSError, leaving no temp file behind."""
    directory, tmp = os.path.dirname(path), None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".neff")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


class NeffCache:
    def __init__(self, directory: str | None = None):
        self.directory = os.path.abspath(directory or os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
                                         or "/tmp/neff_cache")
        self.lock_directory = os.environ.get("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR") or "/tmp/local_cache"
        self.lock_timeout = env_number("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", 1200.0, float)
        self.max_bytes = int(env_number("NEURON_COMPILATION_CACHE_MAX_SIZE_MB", 512.0, float) * (1 << 20))
        self.max_entries = env_number("NEURON_COMPILATION_CACHE_MAX_ENTRIES", 1024)
        self._enabled = not _disabled()
        self._memory = collections.OrderedDict()  # key -> payload, least recently used first
        self._memory_bytes = 0
        self._lock = threading.Lock()  # guards the memory tier and the counters
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)

    @property
    def enabled(self) -> bool:
        return self._enabled

    def path(self, key: str) -> str:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValueError(f"invalid compile cache key {key!r}")
        return os.path.join(self.directory, key[0:2], key[2:4], key + ".neff")

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1

    def record_compilation(self) -> None:
        self._count("TotalCompilations")

    # -- memory tier ---------------------------------------------------------------------------
    def _remember(self, key: str, payload: bytes) -> None:
        with self._lock:
            old = self._memory.pop(key, None)
            if old is not None:
                self._memory_bytes -= len(old)
            if len(payload) > self.max_bytes or self.max_entries == 0:
                return  # larger than the whole tier: serve it from disk only
            self._memory[key] = payload
            self._memory_bytes += len(payload)
            while len(self._memory) > self.max_entries or self._memory_bytes > self.max_bytes:
                _, evicted = self._memory.popitem(last=False)
                self._memory_bytes -= len(evicted)
                self.counters["Evictions"] += 1

    # -- public API ----------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or None. Never raises for a bad or missing entry."""
        path = self.path(key)
        if not self._enabled:
            return None  # disabled: nothing is looked up, no counter moves
        with self._lock:
            payload = self._memory.get(key)
            if payload is not None:
                self._memory.move_to_end(key)
                self.counters["InMemoryHits"] += 1
            else:
                self.counters["InMemoryMisses"] += 1
        if payload is not None:
            _log(f"HIT {key} (memory)")
            return payload
        payload = self._read(key, path)
        if payload is None:
            self._count("PersistentMisses")
            _log(f"MISS {key}")
            return None
        self._count("PersistentHits")
        self._remember(key, payload)
        _log(f"HIT {key} (disk)")
        return payload

    def _read(self, key: str, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                data, st = f.read(), os.fstat(f.fileno())
        except OSError:  # absent, or the directory is unusable: a plain miss
            return None
        if len(data) < _HEADER.size:
            reason = f"truncated header: {len(data)} bytes"
        else:
            magic, length, digest = _HEADER.unpack_from(data)
            payload = data[_HEADER.size:]
            if magic != MAGIC:
                reason = f"bad magic {magic!r}"
            elif len(payload) != length:
                reason = f"length mismatch: header says {length} bytes, file holds {len(payload)}"
            elif hashlib.sha256(payload).digest() != digest:
                reason = "checksum mismatch"
            else:
                return payload
        self._count("CorruptEntries")
        warn_once(("corrupt", key), f"torch_neuronx: corrupt compile cache entry {path} ({reason}); "
                                     f"it will be recompiled")
        with contextlib.suppress(OSError):
            # Only remove the file we read: another process may have just replaced it with a good one.
            if os.stat(path).st_ino == st.st_ino:
                os.unlink(path)
        return None

    def put(self, key: str, payload: bytes) -> None:
        """Store `payload` in both tiers. An unwritable directory warns once; never raises."""
        path = self.path(key)
        if not self._enabled:
            return
        payload = bytes(payload)
        _log(f"Storing {key} ({len(payload)} bytes)")
        self._remember(key, payload)
        try:
            write_atomically(path, _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)
        except OSError as e:
            self.unwritable(e)

    def unwritable(self, error: OSError) -> None:
        """A write into the directory failed: counted, and said once."""
        self._count("WriteFailures")
        warn_once(("unwritable", self.directory),
                  f"torch_neuronx: compile cache directory {self.directory} is not writable "
                  f"({error.strerror or error}); compiled graphs will not be persisted. Set "
                  f"TORCH_NEURONX_NEFF_CACHE_DIR to a writable directory.")

    @contextlib.contextmanager
    def compile_lock(self, key: str):
        """Hold an advisory per-key lock across "get miss -> compile -> put", so concurrent
        processes compiling the same graph wait and then hit. Degrades to no lock, with one warning."""
        self.path(key)  # validates the key
        fd = self._acquire(os.path.join(self.lock_directory, key + ".lock")) if self._enabled else None
        try:
            yield
        finally:
            if fd is not None:  # closing unlocks; the file stays (unlinking races with new lockers)
                os.close(fd)

    def _acquire(self, lock_path: str) -> int | None:
        if fcntl is None:
            return None
        try:
            os.makedirs(self.lock_directory, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            warn_once(("lock", self.lock_directory),
                       f"torch_neuronx: cannot create compile lock {lock_path} ({e.strerror or e}); compiling "
                       f"without it (set TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR to a writable directory)")
            return None
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)  # polled, so the timeout needs no signals (works in any thread)
        os.close(fd)
        warn_once(("lock-timeout", self.lock_directory),
                   f"torch_neuronx: timed out after {self.lock_timeout:g} s waiting for compile lock "
                   f"{lock_path}; compiling without it")
        return None

    def entries(self) -> list:
        """On-disk entries sorted by key (works whether or not the cache is enabled)."""
        out = []
        for path in glob.glob(os.path.join(glob.escape(self.directory), "??", "??", "*.neff")):
            with contextlib.suppress(OSError):  # removed meanwhile
                st = os.stat(path)
                out.append(Entry(os.path.basename(path)[:-5], path, st.st_size, st.st_mtime))
        return sorted(out)

    def total_size(self) -> int:
        return sum(e.size for e in self.entries())

    def clear(self) -> int:
        """Remove all entries (and stale temp files, empty shards); returns how many entries went."""
        with self._lock:
            self._memory.clear()
            self._memory_bytes = 0
        removed, root = 0, glob.escape(self.directory)
        for entry in self.entries():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed += 1
        # Temp files of writers that died mid-write; recent ones may belong to a live writer.
        for tmp in glob.glob(os.path.join(root, "??", "??", ".tmp-*.neff")):
            with contextlib.suppress(OSError):
                if time.time() - os.stat(tmp).st_mtime > 3600:
                    os.unlink(tmp)
        for shard in glob.glob(os.path.join(root, "??", "??")) + glob.glob(os.path.join(root, "??")):
            with contextlib.suppress(OSError):
                os.rmdir(shard)  # inner shards first; fails, as intended, if not empty
        # Inductor's working cache, kept here by the compile backend: useless without the entries.
        shutil.rmtree(os.path.join(self.directory, INDUCTOR_SUBDIR), ignore_errors=True)
        return removed

    def inductor_size(self) -> int:
        """Bytes of Inductor's working cache kept beside the entries."""
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in
                   os.walk(os.path.join(self.directory, INDUCTOR_SUBDIR)) for f in files
                   if os.path.isfile(os.path.join(d, f)))


_instance: NeffCache | None = None
_instance_env = None
_instance_lock = threading.Lock()


def get_cache() -> NeffCache:
    """The process-wide cache; rebuilt when the directory or disable variable changed."""
    global _instance, _instance_env
    env = (os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR"), _disabled())
    with _instance_lock:
        if _instance is None or env != _instance_env:
            _instance, _instance_env = NeffCache(), env
        return _instance
