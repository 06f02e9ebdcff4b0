"""The compile cache on a machine with other users: it loads code only from directories that are
yours alone, or verified with a key (a shared cache), and never through a symlink. Another user
is stood for by `nobody` (chown: root only) or by group and other write bits (any user)."""
import errno
import os
import pwd
import stat
import tempfile
import warnings

import pytest

from torch_neuronx.neuron_dynamo_backend.caching import entries, libraries, signing, trust
from torch_neuronx.neuron_dynamo_backend.caching import neff_cache as cc
from torch_neuronx.runtime.warn import _given as warned

KEY = "k3y-of-the-team-0123456789abcdef"
ENV_VARS = ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_DISABLE_CACHE", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
            "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", signing.KEY_ENV, signing.KEY_FILE_ENV, trust.TRUST_ENV,
            cc.READ_DIRS_ENV, "XDG_CACHE_HOME")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="standing for another user takes chown, so root")


def nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No setting from outside; the defaults and the per-user fallbacks moved into the test's directory."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cc, "DEFAULT_DIRECTORY", str(tmp_path / "neff_cache"))
    monkeypatch.setattr(cc, "DEFAULT_LOCAL_DIRECTORY", str(tmp_path / "local_cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    warned.clear()
    yield
    warned.clear()


def made_by_someone_else(path, mode=0o755):
    path.mkdir(mode=mode, exist_ok=True)
    os.chmod(path, mode)
    os.chown(path, nobody(), -1)
    return path


def caught(fn):
    with warnings.catch_warnings(record=True) as messages:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(m.message) for m in messages]


# -- directories ------------------------------------------------------------------------------------

@needs_root
@pytest.mark.parametrize("named", [False, True])
def test_a_directory_owned_by_someone_else_is_not_used(tmp_path, monkeypatch, named):
    planted = made_by_someone_else(tmp_path / "neff_cache")
    if named:
        monkeypatch.setenv(cc.CACHE_DIR_ENV, str(planted))
    cache, messages = caught(cc.NeffCache)
    assert cache.directory == str(tmp_path / f"neff_cache-{os.geteuid()}") and cache.private
    [message] = messages
    assert str(planted) in message and f"owned by nobody (uid {nobody()})" in message and "mode 0755" in message
    assert cc.CACHE_DIR_ENV in message and signing.KEY_FILE_ENV in message and trust.TRUST_ENV in message
    cache.put(cc.cache_key("k"), b"v")
    assert os.listdir(planted) == [] and stat.S_IMODE(os.stat(cache.directory).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_a_directory_others_can_write_is_not_used(tmp_path, mode):
    planted = tmp_path / "neff_cache"
    planted.mkdir()
    os.chmod(planted, mode)
    cache, [message] = caught(cc.NeffCache)
    assert cache.directory != str(planted) and f"mode {mode:04o}" in message
    assert ("its group" in message) == bool(mode & 0o020) and ("others write" in message) == bool(mode & 0o002)


def test_the_named_directory_is_used_when_trusted_and_nothing_falls_back_silently(tmp_path, monkeypatch):
    shared = tmp_path / "team"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setenv(cc.CACHE_DIR_ENV, str(shared))
    monkeypatch.setenv(trust.TRUST_ENV, "1")
    cache, messages = caught(cc.NeffCache)
    assert (cache.directory, cache.placement.state, messages) == (str(shared), trust.TRUSTED, [])
    monkeypatch.setenv(cc.CACHE_DIR_ENV, "")  # the default is never trusted by the setting
    (tmp_path / "neff_cache").mkdir(mode=0o777)
    os.chmod(tmp_path / "neff_cache", 0o777)
    assert caught(cc.NeffCache)[0].placement.state == trust.PRIVATE  # the fallback


def test_a_directory_above_that_others_can_write_refuses_it_unless_sticky(tmp_path, monkeypatch):
    above = tmp_path / "open"
    above.mkdir()
    os.chmod(above, 0o777)
    assert "above it is writable by its group and others" in trust.check_directory(str(above / "cache")).problem
    os.chmod(above, 0o777 | stat.S_ISVTX)  # as /tmp: nobody may rename another's entry
    assert trust.check_directory(str(above / "cache")).private


@needs_root
def test_a_symlink_someone_else_owns_on_the_way_refuses_the_directory(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert trust.check_directory(str(link)).private  # my own symlink: where it leads is checked
    os.lchown(link, nobody(), -1)
    assert "is a symlink owned by nobody" in trust.check_directory(str(link)).problem


@needs_root
def test_when_no_directory_of_your_own_can_be_had_nothing_is_kept(tmp_path, monkeypatch):
    for name in ("neff_cache", f"neff_cache-{os.geteuid()}"):
        made_by_someone_else(tmp_path / name)
    made_by_someone_else(tmp_path / "xdg")
    cache, [message] = caught(cc.NeffCache)
    assert cache.placement.path is None and "nothing is kept" in message
    key = cc.cache_key("k")
    cache.put(key, b"v")
    assert cc.NeffCache().get(key) is None and cache.inductor_directory() is None


# -- entries and locks ----------------------------------------------------------------------------

def test_entries_and_directories_are_written_yours_alone(tmp_path):
    cache = cc.NeffCache(str(tmp_path / "c"))
    key = cc.cache_key("k")
    cache.put(key, b"v")
    path = cache.path(key)
    assert stat.S_IMODE(os.stat(path).st_mode) == cc.PRIVATE_ENTRY_MODE
    for directory in (tmp_path / "c", os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


@needs_root
def test_an_entry_someone_else_wrote_into_your_directory_is_refused(tmp_path):
    cache = cc.NeffCache(str(tmp_path / "c"))
    key = cc.cache_key("k")
    cache.put(key, b"planted pickle")
    os.chown(cache.path(key), nobody(), -1)
    fresh = cc.NeffCache(str(tmp_path / "c"))
    payload, [message] = caught(lambda: fresh.get(key))
    assert payload is None and "nobody" in message and fresh.counters["RejectedEntries"] == 1
    assert os.path.exists(cache.path(key))  # refused, not removed: the next write replaces it


@pytest.mark.parametrize("what", ["entry", "shard"])
def test_an_entry_is_never_read_or_written_through_a_symlink(tmp_path, what):
    cache, elsewhere = cc.NeffCache(str(tmp_path / "c")), tmp_path / "elsewhere"
    elsewhere.mkdir()
    key = cc.cache_key("k")
    outer, inner, name = entries.parts(key)
    target = elsewhere / name
    target.write_bytes(entries.pack(key, b"planted", None))
    if what == "entry":
        (tmp_path / "c" / outer / inner).mkdir(parents=True)
        (tmp_path / "c" / outer / inner / name).symlink_to(target)
    else:
        (tmp_path / "c" / outer).mkdir(parents=True)
        (tmp_path / "c" / outer / inner).symlink_to(elsewhere)
    payload, [message] = caught(lambda: cache.get(key))
    assert payload is None and "cannot be opened safely" in message
    _, messages = caught(lambda: cache.put(key, b"mine"))
    assert target.read_bytes() == entries.pack(key, b"planted", None)  # untouched
    assert os.listdir(elsewhere) == [name]
    assert (what == "entry") == (cc.NeffCache(str(tmp_path / "c")).get(key) == b"mine")  # renamed over the link


@pytest.mark.parametrize("what", ["lock file", "lock directory"])
def test_a_lock_is_never_opened_through_a_symlink(tmp_path, monkeypatch, what):
    victim = tmp_path / "victim"
    victim.mkdir()
    locks, key = tmp_path / "locks", cc.cache_key("k")
    if what == "lock file":
        locks.mkdir(mode=0o700)
        (locks / f"{key}.lock").symlink_to(victim / "created-by-the-lock")
    else:
        locks.symlink_to(victim)
        os.chmod(victim, 0o777)  # someone else's directory: a symlink to it must not make it ours
    monkeypatch.setenv(cc.LOCAL_DIR_ENV, str(locks))
    cache, _ = caught(lambda: cc.NeffCache(str(tmp_path / "c")))

    def locked():
        with cache.compile_lock(key):
            return True

    assert caught(locked)[0]
    assert os.listdir(victim) == []


@needs_root
def test_a_lock_another_user_holds_does_not_make_you_wait(tmp_path, monkeypatch):
    import fcntl

    theirs, key = made_by_someone_else(tmp_path / "local_cache", 0o777), cc.cache_key("k")
    fd = os.open(theirs / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held for the whole test
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "30")
    try:
        cache, [message] = caught(lambda: cc.NeffCache(str(tmp_path / "c")))
        assert "compile lock directory" in message and cache.lock_directory != str(theirs)

        def locked():
            with cache.compile_lock(key):
                return True

        assert caught(locked) == (True, [])  # no timeout warning: their lock was never ours to wait for
    finally:
        os.close(fd)


# -- a shared cache, verified with a key ----------------------------------------------------------

@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A cache directory that others can write, and the team's key in a file only its owner reads."""
    directory = tmp_path / "team"
    directory.mkdir()
    os.chmod(directory, 0o777)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    os.chmod(key_file, 0o600)
    monkeypatch.setenv(cc.CACHE_DIR_ENV, str(directory))
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(key_file))
    return directory


def test_a_shared_cache_signs_entries_and_loads_only_those_that_verify(shared, monkeypatch):
    cache, messages = caught(cc.NeffCache)
    assert (cache.directory, cache.placement.state, messages) == (str(shared), trust.SHARED, [])
    assert cache.inductor_directory() == os.path.join(cache.lock_directory, cc.INDUCTOR_SUBDIR)  # never shared
    key, other = cc.cache_key("graph"), cc.cache_key("another graph")
    cache.put(key, b"compiled")
    assert stat.S_IMODE(os.stat(cache.path(key)).st_mode) == cc.SHARED_ENTRY_MODE
    assert cc.NeffCache().get(key) == b"compiled"

    def tamper(path, data):  # as anyone who can write the directory could: the checksum recomputed
        with open(path, "wb") as f:
            f.write(data)

    signed = open(cache.path(key), "rb").read()
    theirs = signing.SigningKey(b"x" * 32, "theirs")
    for name, planted, reason in [(key, entries.pack(key, b"evil", None), "carries no MAC"),
                                  (key, entries.pack(key, b"evil", theirs), "does not verify"),
                                  (other, signed, "does not verify")]:  # a good entry replayed under another name
        os.makedirs(os.path.dirname(cache.path(name)), exist_ok=True)
        with open(cache.path(name), "wb") as f:  # as anyone who can write the directory could
            f.write(planted)
        warned.clear()
        fresh = cc.NeffCache()
        payload, [message] = caught(lambda: fresh.get(name))
        assert payload is None and reason in message and fresh.counters["RejectedEntries"] == 1
        assert os.path.exists(cache.path(name))  # refused, not removed: another's file in a shared directory


def test_a_key_turns_an_unsigned_entry_of_your_own_cache_away(tmp_path, monkeypatch):
    key = cc.cache_key("k")
    cc.NeffCache(str(tmp_path / "c")).put(key, b"unsigned")
    monkeypatch.setenv(signing.KEY_ENV, KEY)
    payload, [message] = caught(lambda: cc.NeffCache(str(tmp_path / "c")).get(key))
    assert payload is None and "carries no MAC" in message and signing.KEY_ENV in message


def test_entries_of_the_first_format_still_load_without_a_key(tmp_path):
    import hashlib
    import struct

    cache, key, payload = cc.NeffCache(str(tmp_path / "c")), cc.cache_key("old"), b"written before MACs"
    old = struct.pack("<8sQ32s", entries.MAGIC_V1, len(payload), hashlib.sha256(payload).digest()) + payload
    cache.put(key, b"x")
    with open(cache.path(key), "wb") as f:
        f.write(old)
    assert cc.NeffCache(str(tmp_path / "c")).get(key) == payload


@pytest.mark.parametrize("setting, problem", [
    ({signing.KEY_ENV: "short"}, "needs at least 16"),
    ({signing.KEY_ENV: KEY, signing.KEY_FILE_ENV: "/x"}, "unset the other"),
    ({signing.KEY_FILE_ENV: "{missing}"}, "cannot be read"),
    ({signing.KEY_FILE_ENV: "{world-readable}"}, "others can read"),
    ({signing.KEY_FILE_ENV: "{group-writable}"}, "others can write"),
])
def test_a_key_setting_that_cannot_be_used_is_an_error_naming_it(tmp_path, monkeypatch, setting, problem):
    for name, mode in (("world-readable", 0o644), ("group-writable", 0o620)):
        (tmp_path / name).write_text(KEY)
        os.chmod(tmp_path / name, mode)
    for name, value in setting.items():
        monkeypatch.setenv(name, value.format(**{n: str(tmp_path / n) for n in
                                                 ("missing", "world-readable", "group-writable")}))
    with pytest.raises(ValueError, match=problem) as error:
        cc.NeffCache(str(tmp_path / "c"))
    assert any(name in str(error.value) for name in setting)


def test_a_read_only_tier_is_searched_after_a_miss_and_verified(tmp_path, shared, monkeypatch):
    published = tmp_path / "published"
    monkeypatch.setenv(cc.CACHE_DIR_ENV, str(published))
    key = cc.cache_key("published graph")
    cc.NeffCache().put(key, b"from CI")
    os.chmod(published, 0o555)  # read-only, as a tier a CI job publishes
    mine = tmp_path / "mine"
    monkeypatch.setenv(cc.CACHE_DIR_ENV, str(mine))
    monkeypatch.setenv(cc.READ_DIRS_ENV, str(published))
    assert cc.NeffCache().get(key) == b"from CI"
    assert os.path.exists(cc.NeffCache().path(key))  # copied into your cache, signed with the key
    monkeypatch.setenv(signing.KEY_FILE_ENV, "")
    monkeypatch.setenv(cc.CACHE_DIR_ENV, str(tmp_path / "keyless"))
    cache, [message] = caught(cc.NeffCache)
    assert cache.read_directories == [] and cc.READ_DIRS_ENV in message and "MAC" in message


# -- what a graph's entry carries -----------------------------------------------------------------

def test_a_graph_entry_lists_its_libraries_and_restores_only_bytes_that_match(tmp_path):
    cache, working = cc.NeffCache(str(tmp_path / "c")), tmp_path / "working"
    (working / "ab").mkdir(parents=True)
    (working / "ab" / "kernel.cpp").write_text("// source")
    (working / "ab" / "kernel.so").write_bytes(b"\x7fELF kernel")
    listed = libraries.store(cache, [str(working / "ab" / "kernel.cpp"), str(tmp_path / "outside.cpp")], str(working))
    assert [path for path, _ in listed] == ["ab/kernel.so"]  # nothing outside the working cache
    artifacts, again = libraries.unpack(libraries.pack(b"inductor artifacts", listed))
    assert (artifacts, again) == (b"inductor artifacts", listed)

    elsewhere = tmp_path / "second machine"
    elsewhere.mkdir()
    assert libraries.restore(cache, listed, str(elsewhere)) == 1
    assert (elsewhere / "ab" / "kernel.so").read_bytes() == b"\x7fELF kernel"
    forged = [["ab/other.so", listed[0][1][::-1]], ["../escape.so", listed[0][1]]]
    assert libraries.restore(cache, forged, str(elsewhere)) == 0  # no such bytes; a path out of the cache
    assert not (tmp_path / "escape.so").exists() and sorted(os.listdir(elsewhere / "ab")) == ["kernel.so"]
    with pytest.raises(ValueError):
        libraries.unpack(b"NXNEFF02 not a graph")


def test_safe_files_refuse_names_that_leave_the_directory(tmp_path):
    from torch_neuronx.neuron_dynamo_backend.caching import safe_files

    for parts in (["..", "x"], ["a/b"], [""], ["."]):
        with pytest.raises(ValueError):
            safe_files.write_file(str(tmp_path), parts, b"x", 0o600, 0o700)
    with pytest.raises(OSError) as error:
        safe_files.open_directory(str(tmp_path), ["missing"])
    assert error.value.errno == errno.ENOENT


def test_a_library_planted_in_a_shared_cache_is_never_written_to_the_working_cache(tmp_path, shared):
    cache, working = caught(cc.NeffCache)[0], tmp_path / "working"
    (working / "ab").mkdir(parents=True)
    (working / "ab" / "kernel.cpp").write_text("// source")
    (working / "ab" / "kernel.so").write_bytes(b"\x7fELF the kernel that was built")
    listed = libraries.store(cache, [str(working / "ab" / "kernel.cpp")], str(working))
    [entry] = cache.entries()
    with open(entry.path, "wb") as f:  # someone who can write the shared directory swaps the library
        f.write(entries.pack(entry.key, b"\x7fELF planted", None))
    machine = tmp_path / "second machine"
    machine.mkdir()
    written, messages = caught(lambda: libraries.restore(cc.NeffCache(), listed, str(machine)))
    assert written == 0 and os.listdir(machine) == [] and "carries no MAC" in messages[0]
    assert cache.inductor_directory() != os.path.join(shared, cc.INDUCTOR_SUBDIR)  # nor a .so planted there
