"""The persistent compile-artifact cache (torch_neuronx.neuron_dynamo_backend.caching.neff_cache), AWS's NEFF cache contract."""
import os
import subprocess
import sys
import time
import warnings

import pytest

from torch_neuronx import neuron_cache
from torch_neuronx.neuron_dynamo_backend.caching import neff_cache as cc
from torch_neuronx.neuron_dynamo_backend.caching import trust
from torch_neuronx.runtime import format_bytes
from torch_neuronx.runtime.warn import _given as warned

ENV_VARS = ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_DISABLE_CACHE", "NEURON_COMPILATION_CACHE_MAX_SIZE_MB",
            "NEURON_COMPILATION_CACHE_MAX_ENTRIES", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
            "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "TORCH_NEURONX_LOG_LEVEL", "TORCH_NEURONX_NEFF_CACHE_KEY",
            "TORCH_NEURONX_NEFF_CACHE_KEY_FILE", "TORCH_NEURONX_NEFF_CACHE_TRUST", "TORCH_NEURONX_NEFF_CACHE_READ_DIRS")
ZERO = dict.fromkeys(cc.COUNTER_NAMES, 0)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", str(tmp_path / "locks"))
    warned.clear()  # warnings are once per process; each test starts afresh
    yield
    warned.clear()


def counters(**nonzero):
    return {**ZERO, **nonzero}


def test_round_trip_memory_then_disk(tmp_path):
    d, key, payload = str(tmp_path / "c"), cc.cache_key("graph", "v1"), b"\x00compiled\xff" * 100
    c = cc.NeffCache(d)
    assert c.enabled and c.directory == d
    assert c.get(key) is None
    c.put(key, payload)
    assert c.get(key) == payload
    c.record_compilation()
    assert c.counters == counters(InMemoryMisses=1, PersistentMisses=1, InMemoryHits=1, TotalCompilations=1)
    path = os.path.join(d, key[:2], key[2:4], key + ".neff")
    assert os.path.isfile(path) and c.path(key) == path
    assert os.listdir(os.path.dirname(path)) == [key + ".neff"]  # no temp file left behind

    fresh = cc.NeffCache(d)
    assert fresh.get(key) == payload
    assert fresh.get(key) == payload
    assert fresh.counters == counters(InMemoryMisses=1, PersistentHits=1, InMemoryHits=1)
    [entry] = fresh.entries()
    assert (entry.key, entry.path, entry.size) == (key, path, cc.entry_format.HEADER_SIZE + len(payload))
    assert fresh.total_size() == entry.size and abs(entry.mtime - time.time()) < 60
    with pytest.raises(ValueError):
        fresh.get("../etc/passwd")


def test_directory_from_env_and_get_cache(tmp_path, monkeypatch):
    assert cc.NeffCache().directory == "/tmp/neff_cache"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "a"))
    a = cc.get_cache()
    assert a.directory == str(tmp_path / "a") and cc.get_cache() is a
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "b"))
    b = cc.get_cache()
    assert b is not a and b.directory == str(tmp_path / "b") and b.enabled
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")
    assert not cc.get_cache().enabled


def test_key_stable_and_sensitive():
    k = cc.cache_key("graph", b"\x01\x02", "opts")
    assert k == cc.cache_key("graph", b"\x01\x02", "opts") == cc.cache_key(b"graph", "\x01\x02", b"opts")
    assert len(k) == 32 and int(k, 16) >= 0
    variants = [("graphX", b"\x01\x02", "opts"), ("graph", b"\x01\x03", "opts"), ("graph", b"\x01\x02", "opt"),
                ("graph", b"\x01\x02"), ("graph", b"\x01\x02", "opts", ""), ()]
    assert len({k, *(cc.cache_key(*v) for v in variants)}) == len(variants) + 1
    assert cc.cache_key("ab", "c") != cc.cache_key("a", "bc") != cc.cache_key("abc")
    assert cc.cache_key("é") == cc.cache_key("é".encode())
    with pytest.raises(TypeError):
        cc.cache_key(3)


CORRUPTIONS = {
    "truncated payload": lambda b: b[:-10],
    "truncated header": lambda b: b[:20],
    "empty": lambda b: b"",
    "checksum mismatch": lambda b: b[:90] + bytes([b[90] ^ 1]) + b[91:],  # a payload byte
    "bad magic": lambda b: b"XXNEFF01" + b[8:],
    "length field": lambda b: b[:8] + (5).to_bytes(8, "little") + b[16:],
}


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_corrupt_entry_is_a_miss_warned_once_removed_and_recompiled(tmp_path, how):
    d, key, payload = str(tmp_path), cc.cache_key("corrupt", how), os.urandom(1000)
    cc.NeffCache(d).put(key, payload)
    path = cc.NeffCache(d).path(key)

    def corrupt():
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(CORRUPTIONS[how](data))

    corrupt()
    c = cc.NeffCache(d)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert c.get(key) is None
        assert c.get(key) is None  # file gone now: a plain miss
    assert [w.category for w in caught] == [RuntimeWarning]
    message = str(caught[0].message)
    assert "corrupt compile cache entry" in message and path in message and "recompiled" in message
    assert not os.path.exists(path)
    assert c.counters == counters(InMemoryMisses=2, PersistentMisses=2, CorruptEntries=1)

    c.put(key, payload)  # "recompiled"
    assert cc.NeffCache(d).get(key) == payload

    corrupt()  # corrupt again: counted and removed, but the key was already reported
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = cc.NeffCache(d)
        assert again.get(key) is None
        other = cc.cache_key("another key")  # a different key is reported on its own
        again.put(other, b"x" * 100)
        with open(again.path(other), "r+b") as f:
            f.truncate(50)
        assert cc.NeffCache(d).get(other) is None
    assert again.counters["CorruptEntries"] == 1 and not os.path.exists(path)
    assert len(caught) == 1 and again.path(other) in str(caught[0].message)


_WORKER = """
import os, sys, time
from torch_neuronx.neuron_dynamo_backend.caching import neff_cache as cc
from torch_neuronx.neuron_dynamo_backend.caching import trust
from torch_neuronx.runtime import format_bytes
from torch_neuronx.runtime.warn import _given as warned
key, payload, locked = {key!r}, {payload_expr}, {locked!r}
cache = cc.NeffCache()
while not os.path.exists({go!r}):
    time.sleep(0.005)
if locked:
    with cache.compile_lock(key):
        if cache.get(key) is None:
            time.sleep(0.2)  # "compile"
            cache.record_compilation()
            cache.put(key, payload)
else:  # no lock: hammer the same key, every read must be some writer's whole payload
    for i in range(5):
        cache.put(key, payload)
        got = cache.get(key)  # the memory tier is off (MAX_ENTRIES=0): this reads the file
        assert got is not None and got == bytes(got[:1]) * len(payload), "torn entry"
assert cache.counters["CorruptEntries"] == 0 and cache.counters["WriteFailures"] == 0, cache.counters
print("put" if cache.counters["TotalCompilations"] else "hit")
"""


def _run_writers(tmp_path, monkeypatch, locked, payload_expr):
    d, key, go = tmp_path / "cache", cc.cache_key("same graph"), tmp_path / "go"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(d))
    if not locked:
        monkeypatch.setenv("NEURON_COMPILATION_CACHE_MAX_ENTRIES", "0")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER.format(
        key=key, payload_expr=payload_expr.format(i=i), locked=locked, go=str(go))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(8)]
    time.sleep(0.3)
    go.touch()  # start them together
    try:  # eight imports of torch share the cores with the rest of the suite: a hang guard, not a time limit
        results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [r[2] for r in results] == [0] * 8, [r[1] for r in results]
    assert not [f for _, _, files in os.walk(d) for f in files if f.startswith(".tmp-")]
    return cc.NeffCache(str(d)), key, [r[0].strip() for r in results]


@pytest.mark.long  # concurrent compiling processes: make test-long (CI runs it; make test stays under 10 minutes)
def test_concurrent_writers_with_compile_lock_compile_once(tmp_path, monkeypatch):
    payload = bytes(range(256)) * 4096  # 1 MiB
    cache, key, outcomes = _run_writers(tmp_path, monkeypatch, True, "bytes(range(256)) * 4096")
    assert sorted(outcomes) == ["hit"] * 7 + ["put"]  # the lock serialized them: one compiled, seven hit
    assert cache.get(key) == payload and cache.counters["CorruptEntries"] == 0
    assert len(os.listdir(tmp_path / "locks")) == 1


@pytest.mark.long  # concurrent compiling processes: make test-long (CI runs it; make test stays under 10 minutes)
def test_concurrent_writers_without_lock_never_tear(tmp_path, monkeypatch):
    # Eight different 1 MiB payloads (each a single repeated byte) to one key: atomic replace means
    # the survivor is exactly one of them.
    cache, key, _ = _run_writers(tmp_path, monkeypatch, False, "bytes([{i}]) * (1 << 20)")
    got = cache.get(key)
    assert got in [bytes([i]) * (1 << 20) for i in range(8)]
    assert cache.counters["CorruptEntries"] == 0 and len(cache.entries()) == 1


def _unwritable(tmp_path, kind):
    if kind == "path is a file":
        path = tmp_path / "not-a-dir"
        path.write_text("x")
        return str(path)
    # (A read-only directory stays writable for root, which CI may be: a file as parent fails for all.)
    parent = tmp_path / "a-file"
    parent.write_text("x")
    return str(parent / "cache")


@pytest.mark.parametrize("kind", ["path is a file", "parent is a file"])
def test_unwritable_directory_warns_once_and_keeps_memory_tier(tmp_path, kind):
    d = _unwritable(tmp_path, kind)
    c = cc.NeffCache(d)
    k1, k2 = cc.cache_key("one"), cc.cache_key("two")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c.put(k1, b"first")
        c.put(k2, b"second")
        cc.NeffCache(d).put(k1, b"again")  # once per directory per process, not per instance
    assert [w.category for w in caught] == [RuntimeWarning]
    message = str(caught[0].message)
    assert d in message and "will not be persisted" in message and "TORCH_NEURONX_NEFF_CACHE_DIR" in message
    assert c.counters["WriteFailures"] == 2
    assert c.get(k1) == b"first" and c.get(k2) == b"second"  # memory tier still works
    assert cc.NeffCache(d).get(k1) is None  # nothing persisted
    assert cc.NeffCache(d).entries() == [] and not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_unusable_lock_directory_proceeds_without_lock(tmp_path, monkeypatch):
    (tmp_path / "lockfile").write_text("x")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", str(tmp_path / "lockfile"))
    c, key = cc.NeffCache(str(tmp_path / "c")), cc.cache_key("k")
    with pytest.warns(RuntimeWarning, match="compiling without it"):
        with c.compile_lock(key):
            c.put(key, b"v")
    assert cc.NeffCache(str(tmp_path / "c")).get(key) == b"v"


def test_lock_timeout_proceeds_without_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "0.2")
    c, key = cc.NeffCache(str(tmp_path / "c")), cc.cache_key("k")
    with c.compile_lock(key):  # flock is per open file: a second acquisition in-process blocks too
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="timed out after 0.2 s"):
            with c.compile_lock(key):
                pass
        assert 0.15 < time.monotonic() - start < 2


@pytest.mark.parametrize("value", ["1", "TRUE", "yes", " Yes ", "on", "ON"])
def test_disable_variable_turns_off_both_tiers(tmp_path, monkeypatch, value):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", value)
    c, key = cc.NeffCache(str(tmp_path / "c")), cc.cache_key("k")
    assert not c.enabled
    c.put(key, b"payload")
    assert c.get(key) is None
    with c.compile_lock(key):
        pass
    assert c.counters == ZERO  # defined: a disabled cache looks nothing up, so nothing is counted
    assert not os.path.exists(tmp_path / "c") and not os.path.exists(tmp_path / "locks")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "0")
    assert cc.NeffCache(str(tmp_path / "c")).enabled


def test_lru_eviction_by_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILATION_CACHE_MAX_ENTRIES", "2")
    c = cc.NeffCache(str(tmp_path))
    k = [cc.cache_key(str(i)) for i in range(3)]
    c.put(k[0], b"0")
    c.put(k[1], b"1")
    assert c.get(k[0]) == b"0"  # k0 now most recent; k1 is the LRU victim
    c.put(k[2], b"2")
    assert c.counters["Evictions"] == 1
    c.counters.update(ZERO)  # count from here on
    assert c.get(k[0]) == b"0" and c.get(k[2]) == b"2"
    assert c.counters == counters(InMemoryHits=2)
    assert c.get(k[1]) == b"1"  # evicted from memory, still on disk; promoting it evicts k0
    assert c.counters == counters(InMemoryHits=2, InMemoryMisses=1, PersistentHits=1, Evictions=1)
    assert len(c.entries()) == 3


def test_lru_eviction_by_size(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILATION_CACHE_MAX_SIZE_MB", "1")
    c = cc.NeffCache(str(tmp_path))
    k = [cc.cache_key(str(i)) for i in range(4)]
    for i in range(3):
        c.put(k[i], bytes([i]) * 400_000)  # three of them exceed 1 MiB
    assert c.counters["Evictions"] == 1
    c.put(k[3], b"x" * (2 << 20))  # larger than the whole tier: kept on disk only, evicts nothing
    assert c.counters["Evictions"] == 1
    c.counters.update(ZERO)  # count from here on
    assert c.get(k[0]) == bytes([0]) * 400_000 and c.get(k[3]) == b"x" * (2 << 20)
    assert c.counters == counters(InMemoryMisses=2, PersistentHits=2, Evictions=1)
    assert len(c.entries()) == 4


def test_log_level_2_prints_hit_miss_storing(tmp_path, monkeypatch, capsys):
    c, key = cc.NeffCache(str(tmp_path)), cc.cache_key("logged")
    c.get(key)
    assert capsys.readouterr().err == ""  # default level 1: quiet
    monkeypatch.setenv("TORCH_NEURONX_LOG_LEVEL", "2")
    c.get(key)
    c.put(key, b"12345")
    c.get(key)
    cc.NeffCache(str(tmp_path)).get(key)
    assert capsys.readouterr().err.splitlines() == [
        f"[NEFF_CACHE] MISS {key}", f"[NEFF_CACHE] Storing {key} (5 bytes)",
        f"[NEFF_CACHE] HIT {key} (memory)", f"[NEFF_CACHE] HIT {key} (disk)"]


def _cli(argv, capsys):
    """(exit status, the lines after the four that describe the directories, those four)."""
    status = neuron_cache.main(argv)
    lines = capsys.readouterr().out.splitlines()
    return status, lines[4:], lines[:4]


def test_cli_list_size_clear(tmp_path, monkeypatch, capsys):
    d = tmp_path / "cli"
    c = cc.NeffCache(str(d))
    keys = sorted(cc.cache_key(str(i)) for i in range(3))
    for i, k in enumerate(keys):
        c.put(k, b"p" * (100 * (i + 1)))
    header = cc.entry_format.HEADER_SIZE
    total = 3 * header + 600

    status, lines, described = _cli(["--dir", str(d), "list"], capsys)
    assert status == 0 and [line.split()[0] for line in lines[:3]] == keys and len(lines) == 4
    assert lines[0].split()[1] == str(header + 100) and "T" in lines[0].split()[2]
    assert lines[3] == f"total {total} bytes ({format_bytes(total)}) in 3 entries, {d}"
    assert described[0] == f"cache    {d}: owned by {trust.who(os.geteuid())}, mode 0700; yours alone: used as it is"
    assert described[1].startswith("entries  unsigned") and described[3] == f"inductor {d / cc.INDUCTOR_SUBDIR}"

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(d))  # the default directory comes from the env
    assert _cli(["size"], capsys)[:2] == (0, [f"total {total} bytes ({format_bytes(total)}) in 3 entries, {d}"])
    assert _cli(["verify"], capsys)[:2] == (0, [f"3 of 3 entries would load, {d}"])

    assert _cli(["clear", "--dir", str(d)], capsys)[:2] == (0, [f"removed 3 entries from {d}"])
    assert os.listdir(d) == []  # empty shard directories went too
    assert _cli(["list"], capsys)[:2] == (0, [f"total 0 bytes (0 B) in 0 entries, {d}"])

    for bad in ([], ["bogus"], ["list", "--dir"], ["--nope", "size"]):
        assert neuron_cache.main(bad) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (bad, err)


def test_cli_as_module(tmp_path):
    module = "torch_neuronx.neuron_cache"
    d = tmp_path / "m"
    cc.NeffCache(str(d)).put(cc.cache_key("x"), b"y" * 2000)
    r = subprocess.run([sys.executable, "-m", module, "size", "--dir", str(d)],
                       capture_output=True, text=True, timeout=120)
    size = 2000 + cc.entry_format.HEADER_SIZE
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == f"total {size} bytes ({format_bytes(size)}) in 1 " \
        f"entries, {d}", r.stderr
    r = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: "), r.stderr


@pytest.fixture
def probe_library(tmp_path, monkeypatch):
    """A stand-in for one of Inductor's ISA probe libraries, and a fake dlopen probe counting its calls
    (its answer set by the test)."""
    from torch_neuronx.neuron_dynamo_backend.caching import isa_probe

    assert isa_probe._install()
    calls, answer = [], {"loads": True}

    def fake_probe(isa, path):
        calls.append(path)
        return answer["loads"]

    monkeypatch.setattr(isa_probe, "_original_probe_load", fake_probe)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    library = tmp_path / "probe.so"
    library.write_bytes(b"\x7fELF probe library")
    return str(library), calls, answer


def _probe(path):
    from torch._inductor.cpu_vec_isa import VecAVX2

    return VecAVX2()._probe_load(path)


def _records(tmp_path):
    return sorted((tmp_path / "neff" / cc.INDUCTOR_SUBDIR / "vec_isa_probes").glob("*.ok"))


def test_isa_probe_answered_from_a_record_only_inside_the_backends_context(tmp_path, probe_library):
    from torch_neuronx.neuron_dynamo_backend.caching import isa_probe

    library, calls, _ = probe_library
    assert _probe(library) and len(calls) == 1 and _records(tmp_path) == []  # outside: Inductor's probe, no record
    with isa_probe.remembered_probes():
        assert _probe(library) and len(calls) == 2  # no record yet: probed, then recorded
        [record] = _records(tmp_path)
        assert _probe(library) and len(calls) == 2  # answered from the record
    assert _probe(library) and len(calls) == 3  # outside again: Inductor's own probe
    with isa_probe.remembered_probes():
        with open(library, "ab") as f:  # a rebuilt library is a different library: probed again
            f.write(b"rebuilt")
        assert _probe(library) and len(calls) == 4 and len(_records(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "appended"])
def test_isa_probe_record_that_does_not_read_back_is_ignored_and_rewritten(tmp_path, probe_library, damage):
    from torch_neuronx.neuron_dynamo_backend.caching import isa_probe

    library, calls, _ = probe_library
    with isa_probe.remembered_probes():
        _probe(library)
        [record] = _records(tmp_path)
        good = record.read_bytes()
        record.write_bytes({"garbage": b"\x00" * len(good), "truncated": good[:-5], "empty": b"",
                            "appended": good + b"x"}[damage])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a damaged record is only a miss
            assert _probe(library) and len(calls) == 2
        assert record.read_bytes() == good
        assert _probe(library) and len(calls) == 2


def test_isa_probe_failures_are_not_recorded_and_a_disabled_cache_keeps_no_records(tmp_path, probe_library,
                                                                                    monkeypatch):
    from torch_neuronx.neuron_dynamo_backend.caching import isa_probe

    library, calls, answer = probe_library
    answer["loads"] = False
    with isa_probe.remembered_probes():
        assert not _probe(library) and not _probe(library) and len(calls) == 2
        assert _records(tmp_path) == []
        answer["loads"] = True
        monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")
        assert _probe(library) and _probe(library) and len(calls) == 4
        assert _records(tmp_path) == []


def test_isa_probe_record_of_another_environment_is_not_trusted(tmp_path, probe_library, monkeypatch):
    from torch_neuronx.neuron_dynamo_backend.caching import isa_probe

    library, calls, _ = probe_library
    with isa_probe.remembered_probes():
        _probe(library)
        real_python = isa_probe.sys.executable
        monkeypatch.setattr(isa_probe.sys, "executable", "/another/python")
        assert _probe(library) and len(calls) == 2
        monkeypatch.setattr(isa_probe.sys, "executable", real_python)
        monkeypatch.setattr(isa_probe, "cpu_description", lambda: "x86_64|another cpu|avx2")
        assert _probe(library) and len(calls) == 3
        assert len(_records(tmp_path)) == 3
