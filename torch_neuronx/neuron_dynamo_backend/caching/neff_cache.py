"""Persistent, process-safe compile-artifact cache, shaped like AWS TorchNeuron's NEFF cache.

The torch.compile backend stores opaque bytes here (serialized compiled graphs) under a key
built with `cache_key(...)`. Two tiers: an in-memory LRU in front of an on-disk directory of
entries sharded as `<dir>/<key[0:2]>/<key[2:4]>/<key>.neff` (:mod:`.entries`), and, with a key,
read-only directories after it. Entries carry a header (magic, length, sha256, MAC) so a torn or
corrupt file is detected, removed and recompiled, never loaded.
Writes are atomic (temp file + fsync + rename); `compile_lock(key)` is an advisory per-key file
lock so that N processes compiling the same graph compile it once.

The entries are code, so who can write the directories matters (:mod:`.trust`): the cache and lock
directories are used as they are only when they are yours alone (created 0700, entries 0600);
one that others can write is used only with a key (:mod:`.signing`: every entry's MAC verified
before it is loaded, entries 0644) or when named and trusted by ``TORCH_NEURONX_NEFF_CACHE_TRUST``;
otherwise a per-user directory replaces it, with one warning. No entry or lock is opened through a
symlink below the directory (:mod:`.safe_files`).

Environment (names as in AWS's docs, then this project's):
  TORCH_NEURONX_NEFF_CACHE_DIR           cache directory (default /tmp/neff_cache)
  TORCH_NEURONX_NEFF_DISABLE_CACHE       1/true/yes/on: disable both tiers
  NEURON_COMPILATION_CACHE_MAX_SIZE_MB   in-memory tier budget in MiB (default 512)
  NEURON_COMPILATION_CACHE_MAX_ENTRIES   in-memory tier entry limit (default 1024)
  TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR     per-key lock files, and Inductor's working cache for a shared
                                         cache (default /tmp/local_cache)
  TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT  seconds to wait for a compile lock (default 1200)
  TORCH_NEURONX_LOG_LEVEL                >= 2 prints HIT/MISS/Storing lines to stderr (default 1)
  TORCH_NEURONX_NEFF_CACHE_KEY(_FILE)    the key of a shared cache (:mod:`.signing`)
  TORCH_NEURONX_NEFF_CACHE_READ_DIRS     read-only tiers (os.pathsep-separated) searched after a miss, e.g. a
                                         cache a CI job publishes; with a key only (every entry verified)
  TORCH_NEURONX_NEFF_CACHE_TRUST         1: use the named directories even though others can write them

Differences from AWS: the entries hold Inductor-compiled host code, not NEFFs (the `.neff`
name is kept for layout compatibility), keys are blake2b-128 digests rather than XXH3-128, and
AWS checks no directory's owner and signs no entry (a NEFF runs on the device, not as host code).

``neuron-cache [--dir PATH] {list,size,clear,verify}`` (:mod:`torch_neuronx.neuron_cache`) inspects it.
"""
import collections
import contextlib
import errno
import hashlib
import os
import shutil
import struct
import sys
import threading
import time

try:
    import fcntl
except ImportError:  # not POSIX: compile without the cross-process lock
    fcntl = None

from torch_neuronx.neuron_dynamo_backend.caching import entries as entry_format
from torch_neuronx.neuron_dynamo_backend.caching import safe_files, signing, trust
from torch_neuronx.neuron_dynamo_backend.caching.entries import Entry  # noqa: F401 - part of this module's API
from torch_neuronx.runtime import env_flag, env_number, warn_once

# Where the compile backend keeps Inductor's own cache (generated code, built libraries).
INDUCTOR_SUBDIR = "inductor"
CACHE_DIR_ENV, DEFAULT_DIRECTORY = "TORCH_NEURONX_NEFF_CACHE_DIR", "/tmp/neff_cache"
LOCAL_DIR_ENV, DEFAULT_LOCAL_DIRECTORY = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "/tmp/local_cache"
READ_DIRS_ENV = "TORCH_NEURONX_NEFF_CACHE_READ_DIRS"
PRIVATE_ENTRY_MODE, SHARED_ENTRY_MODE = 0o600, 0o644
COUNTER_NAMES = ("InMemoryHits", "InMemoryMisses", "PersistentHits", "PersistentMisses",
                 "Evictions", "TotalCompilations", "CorruptEntries", "WriteFailures", "RejectedEntries")
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


def _read_directories(signing_key: signing.SigningKey | None) -> list[str]:
    """The read-only tiers the settings name; none without a key (said once), since nothing that
    others wrote is loaded unverified."""
    named = [os.path.abspath(p) for p in os.environ.get(READ_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    if named and signing_key is None:
        warn_once(("read-dirs", tuple(named)), f"torch_neuronx: ignoring {READ_DIRS_ENV}: entries from a shared "
                                               f"cache are loaded only when their MAC verifies; set "
                                               f"{signing.KEY_FILE_ENV} (or {signing.KEY_ENV}) to the key they "
                                               f"were written with")
        return []
    return named


class NeffCache:
    def __init__(self, directory: str | None = None, fallback: bool = True):
        """The cache in ``directory`` (else $TORCH_NEURONX_NEFF_CACHE_DIR, else the default), placed
        as :mod:`.trust` says; without ``fallback`` that directory is examined, never replaced.
        Raises ValueError for a setting that cannot be used (the disable switch, a key)."""
        self._enabled = not _disabled()
        self.key = signing.load()
        self.placement = trust.place(directory or os.environ.get(CACHE_DIR_ENV), DEFAULT_DIRECTORY, CACHE_DIR_ENV,
                                     "compile cache", verified=self.key is not None, fallback=fallback,
                                     hint=_SHARING_HINT)
        self.directory = self.placement.path or self.placement.check.path
        self.read_directories = _read_directories(self.key)
        self.local = trust.place(os.environ.get(LOCAL_DIR_ENV), DEFAULT_LOCAL_DIRECTORY, LOCAL_DIR_ENV,
                                 "compile lock directory")
        self.lock_directory = self.local.path
        self.lock_timeout = env_number("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", 1200.0, float)
        self.max_bytes = int(env_number("NEURON_COMPILATION_CACHE_MAX_SIZE_MB", 512.0, float) * (1 << 20))
        self.max_entries = env_number("NEURON_COMPILATION_CACHE_MAX_ENTRIES", 1024)
        self._memory = collections.OrderedDict()  # key -> payload, least recently used first
        self._memory_bytes = 0
        self._lock = threading.Lock()  # guards the memory tier and the counters
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def private(self) -> bool:
        """Whether the directory is yours alone (entries need no key, and are written 0600)."""
        return self.placement.state == trust.PRIVATE

    def _usable(self) -> bool:
        """Whether entries may be read from and written to the directory."""
        return self._enabled and self.placement.state != trust.REFUSED and self.placement.path is not None

    def inductor_directory(self) -> str | None:
        """Where Inductor's working cache (generated modules, built libraries: code it loads without
        checking) goes: beside the entries in a directory yours alone or trusted; for a cache with a
        key, in the local directory, since from a shared cache only entries whose MAC verifies load."""
        if not self._usable():
            return None
        if self.key is None and self.placement.state in (trust.PRIVATE, trust.TRUSTED):
            return os.path.join(self.directory, INDUCTOR_SUBDIR)
        return os.path.join(self.lock_directory, INDUCTOR_SUBDIR) if self.lock_directory else None

    def path(self, key: str) -> str:
        return os.path.join(self.directory, *entry_format.parts(key))

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

    def _recall(self, key: str) -> bytes | None:
        with self._lock:
            payload = self._memory.get(key)
            if payload is not None:
                self._memory.move_to_end(key)
                self.counters["InMemoryHits"] += 1
            else:
                self.counters["InMemoryMisses"] += 1
        return payload

    # -- public API ----------------------------------------------------------------------------
    def get(self, key: str, remember: bool = True) -> bytes | None:
        """The payload stored under `key`, or None. Never raises for a bad or missing entry.
        ``remember``: keep it in the memory tier (not for bytes only read once, as libraries)."""
        entry_format.parts(key)  # validates the key
        if not self._enabled:
            return None  # disabled: nothing is looked up, no counter moves
        payload = self._recall(key)
        if payload is not None:
            _log(f"HIT {key} (memory)")
            return payload
        payload = self._read(key)
        if payload is None:
            self._count("PersistentMisses")
            _log(f"MISS {key}")
            return None
        self._count("PersistentHits")
        if remember:
            self._remember(key, payload)
        _log(f"HIT {key} (disk)")
        return payload

    def _check_root(self, fd: int) -> None:
        """Refuse a directory that stopped being yours alone (or was made by someone else after
        the cache was placed there, before it first wrote)."""
        if self.private and (problem := trust.descriptor_problem(fd)) is not None:
            raise PermissionError(errno.EACCES, f"{self.directory}: {problem}")

    def _read(self, key: str) -> bytes | None:
        """The payload of ``key``'s entry: in the directory, else in a read-only tier (then copied
        into the directory, so that the next process finds it there)."""
        if self._usable() and (payload := self._read_from(self.directory, key, main=True)) is not None:
            return payload
        for directory in self.read_directories if self._enabled else ():
            if (payload := self._read_from(directory, key, main=False)) is not None:
                self.put(key, payload, remember=False)
                return payload
        return None

    def _read_from(self, directory: str, key: str, main: bool) -> bytes | None:
        """An entry of the directory (``main``) or of a read-only tier, if it may be loaded."""
        try:
            data, status = safe_files.read_file(directory, entry_format.parts(key), self._check_root if main else None)
        except FileNotFoundError:
            return None
        except OSError as error:  # a symlink, not a file, a directory no longer ours: never read
            if os.path.isdir(directory):  # else nothing is there to read (put says why)
                self._refuse(key, directory, f"it cannot be opened safely ({error.strerror or error})")
            return None
        try:
            payload, digest, mac = entry_format.unpack(data)
            entry_format.check(key, status, digest, mac, self.key, main and self.private)
            return payload
        except entry_format.Unusable as unusable:
            if unusable.corrupt and main:
                self._discard(key, status, str(unusable))
            else:  # never removed from a read-only tier
                self._refuse(key, directory, str(unusable))
            return None

    def examine(self, key: str) -> str | None:
        """Why the entry for ``key`` would not load (None: it would), without loading or changing it."""
        try:
            data, status = safe_files.read_file(self.directory, entry_format.parts(key),
                                                self._check_root if self._usable() else None)
            payload, digest, mac = entry_format.unpack(data)
            entry_format.check(key, status, digest, mac, self.key, self.private)
        except (OSError, entry_format.Unusable) as problem:
            return str(problem)
        return "the directory is refused: compiles load nothing from it" if not self._usable() else None

    def _discard(self, key: str, status: os.stat_result, reason: str) -> None:
        path = self.path(key)
        self._count("CorruptEntries")
        warn_once(("corrupt", key), f"torch_neuronx: corrupt compile cache entry {path} ({reason}); "
                                     f"it will be recompiled")
        with contextlib.suppress(OSError):
            # Only remove the file we read: another process may have just replaced it with a good one.
            if os.lstat(path).st_ino == status.st_ino:
                os.unlink(path)

    def _refuse(self, key: str, directory: str, reason: str) -> None:
        """An entry not loaded for what it is, not for damage: left for its writer (put replaces it)."""
        self._count("RejectedEntries")
        path = os.path.join(directory, *entry_format.parts(key))
        warn_once(("refused", path), f"torch_neuronx: not loading compile cache entry {path}: {reason}; it will "
                                     f"be recompiled")

    def put(self, key: str, payload: bytes, remember: bool = True) -> None:
        """Store `payload` in both tiers (the disk only, without ``remember``). An unwritable
        directory warns once; never raises."""
        entry_format.parts(key)
        if not self._enabled:
            return
        payload = bytes(payload)
        _log(f"Storing {key} ({len(payload)} bytes)")
        if remember:
            self._remember(key, payload)
        if not self._usable():
            return
        try:
            self._write(entry_format.parts(key), entry_format.pack(key, payload, self.key))
        except OSError as e:
            self.unwritable(e)

    def _write(self, parts, data: bytes) -> None:
        if self.private:
            trust.make_directory(self.directory)  # 0700; checked again when opened
            safe_files.write_file(self.directory, parts, data, PRIVATE_ENTRY_MODE, trust.PRIVATE_DIRECTORY_MODE,
                                  self._check_root)
        else:  # shared: as the directory's group and the umask allow, so others can add entries too
            os.makedirs(self.directory, exist_ok=True)
            safe_files.write_file(self.directory, parts, data, SHARED_ENTRY_MODE, 0o777)

    def contains(self, key: str) -> bool:
        """Whether an entry file exists for ``key`` in the directory (not whether it would load)."""
        return self._usable() and os.path.lexists(self.path(key))

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
        entry_format.parts(key)  # validates the key
        fd = self._acquire(key + ".lock") if self._enabled else None
        try:
            yield
        finally:
            if fd is not None:  # closing unlocks; the file stays (unlinking races with new lockers)
                os.close(fd)

    def _open_lock(self, name: str) -> int | None:
        if fcntl is None or self.lock_directory is None:
            return None
        try:
            if self.local.state == trust.PRIVATE:
                trust.make_directory(self.lock_directory)
            return safe_files.open_lock_file(self.lock_directory, name, self._check_lock_root)
        except OSError as e:
            warn_once(("lock", self.lock_directory),
                      f"torch_neuronx: cannot create compile lock {os.path.join(self.lock_directory, name)} "
                      f"({e.strerror or e}); compiling without it (set {LOCAL_DIR_ENV} to a writable directory)")
            return None

    def _check_lock_root(self, fd: int) -> None:
        if self.local.state == trust.PRIVATE and (problem := trust.descriptor_problem(fd)) is not None:
            raise PermissionError(errno.EACCES, f"{self.lock_directory}: {problem}")

    def _acquire(self, name: str) -> int | None:
        fd = self._open_lock(name)
        if fd is None:
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
                  f"{os.path.join(self.lock_directory, name)}; compiling without it")
        return None

    # -- inspection ----------------------------------------------------------------------------
    def entries(self) -> list:
        """On-disk entries sorted by key (works whether or not the cache is enabled)."""
        return entry_format.listing(self.directory)

    def total_size(self) -> int:
        return sum(e.size for e in self.entries())

    def clear(self) -> int:
        """Remove all entries (and stale temp files, empty shards); returns how many entries went."""
        with self._lock:
            self._memory.clear()
            self._memory_bytes = 0
        removed = 0
        for entry in self.entries():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed += 1
        for outer in entry_format.shard_directories(self.directory):
            for inner in entry_format.shard_directories(outer):
                entry_format.remove_stale_temporaries(inner)
                with contextlib.suppress(OSError):
                    os.rmdir(inner)  # fails, as intended, if not empty
            with contextlib.suppress(OSError):
                os.rmdir(outer)
        # Inductor's working cache, kept by the compile backend: useless without the entries.
        for working in self.inductor_directories():
            shutil.rmtree(working, ignore_errors=True)
        return removed

    def inductor_directories(self) -> list[str]:
        """Inductor's working caches of this cache: beside the entries, and in the local directory."""
        bases = [self.directory] + ([self.lock_directory] if self.lock_directory else [])
        return [os.path.join(base, INDUCTOR_SUBDIR) for base in bases
                if os.path.isdir(os.path.join(base, INDUCTOR_SUBDIR))
                and not os.path.islink(os.path.join(base, INDUCTOR_SUBDIR))]

    def inductor_size(self) -> int:
        """Bytes of Inductor's working cache kept beside the entries (or in the local directory)."""
        return sum(os.lstat(os.path.join(d, f)).st_size for working in self.inductor_directories()
                   for d, _, files in os.walk(working) for f in files
                   if os.path.isfile(os.path.join(d, f)) and not os.path.islink(os.path.join(d, f)))


_SHARING_HINT = (f"; to share a cache with others on purpose, give it a key ({signing.KEY_FILE_ENV}), so that "
                 f"every entry is verified before it is loaded")


_instance: NeffCache | None = None
_instance_env = None
_instance_lock = threading.Lock()

# Every variable that decides where the cache is and what it trusts: a change gives a new cache.
_PLACEMENT_VARIABLES = (CACHE_DIR_ENV, LOCAL_DIR_ENV, DISABLE_ENV, READ_DIRS_ENV, signing.KEY_ENV,
                        signing.KEY_FILE_ENV, trust.TRUST_ENV, "TMPDIR", "XDG_CACHE_HOME")


def get_cache() -> NeffCache:
    """The process-wide cache; rebuilt when a variable that places it changed."""
    global _instance, _instance_env
    env = tuple(os.environ.get(name) for name in _PLACEMENT_VARIABLES)
    with _instance_lock:
        if _instance is None or env != _instance_env:
            _instance, _instance_env = NeffCache(), env
        return _instance
