"""Whether the compile cache may trust a directory, and which directories it uses.

The cache holds code: Inductor's generated modules and built libraries, pickled graphs, Dynamo's
packages. Whoever can write a directory the cache loads from can run code as you. A directory is
*private* when it is owned by you and neither its group nor others may write to it, every directory
above it is owned by you or root and writable by no one else unless sticky (as /tmp is: there
nobody may rename or remove another's entry), and every symlink on the way to it is yours or root's.

A directory asked for (named by its variable, or the default) is used as it is when private. When it
is not, it is used only where what it holds is verified (the cache with a key: :mod:`.signing`) or
the user said to trust it (``TORCH_NEURONX_NEFF_CACHE_TRUST``, for a directory they named);
otherwise one warning names it and why, and a per-user directory is used instead. Directories the
cache creates are created 0700.
"""
from __future__ import annotations

import dataclasses
import os
import stat
import tempfile

from torch_neuronx.runtime import env_flag, warn_once

PRIVATE_DIRECTORY_MODE = 0o700
TRUST_ENV = "TORCH_NEURONX_NEFF_CACHE_TRUST"

PRIVATE = "private"      # yours alone: used as it is
SHARED = "shared"        # others may write it: used, every entry verified with the key
TRUSTED = "trusted"      # others may write it: used as it is, because the user said so
REFUSED = "refused"      # others may write it: nothing is loaded from it


def who(uid: int) -> str:
    """A user as `name (uid N)`."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _writers(mode: int) -> str:
    return " and ".join(name for bit, name in ((0o020, "its group"), (0o002, "others")) if mode & bit)


@dataclasses.dataclass(frozen=True)
class DirectoryCheck:
    """What was found at ``path``: ``problem`` says why it is not private (None: it is)."""
    path: str
    problem: str | None
    owner: int | None = None
    mode: int | None = None

    @property
    def private(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        if self.owner is None:
            return "not created yet"
        return f"owned by {who(self.owner)}, mode {self.mode:04o}"


def descriptor_problem(fd: int) -> str | None:
    """Why the open directory ``fd`` is not yours alone (None: it is)."""
    return _own_problem(os.fstat(fd))


def _own_problem(status: os.stat_result) -> str | None:
    if status.st_uid != os.geteuid():
        return f"it is owned by {who(status.st_uid)}, not by you ({who(os.geteuid())})"
    if status.st_mode & 0o022:
        return f"its mode {stat.S_IMODE(status.st_mode):04o} lets {_writers(status.st_mode)} write to it"
    return None


def _symlink_problem(path: str) -> str | None:
    """A symlink on the way to ``path`` (as written) that someone else owns: it leads where they choose."""
    current = os.sep
    for part in path.split(os.sep)[1:]:
        current = os.path.join(current, part)
        try:
            status = os.lstat(current)
        except OSError:
            return None  # missing from here on: nothing more to follow
        if stat.S_ISLNK(status.st_mode) and status.st_uid not in (0, os.geteuid()):
            return f"{current} on its path is a symlink owned by {who(status.st_uid)}"
    return None


def _ancestor_problem(path: str) -> str | None:
    """A directory above ``path`` that someone else could rename or replace it in."""
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            status = os.lstat(parent)
        except FileNotFoundError:
            status = None  # will be created, 0700, by the cache
        if status is not None and status.st_uid not in (0, os.geteuid()):
            return f"{parent} above it is owned by {who(status.st_uid)}"
        if status is not None and status.st_mode & 0o022 and not status.st_mode & stat.S_ISVTX:
            return f"{parent} above it is writable by {_writers(status.st_mode)} (mode " \
                   f"{stat.S_IMODE(status.st_mode):04o}, not sticky)"
        if parent == os.path.dirname(parent):
            return None
        parent = os.path.dirname(parent)


def check_directory(path: str) -> DirectoryCheck:
    """Whether ``path`` is (or, not created yet, would be) a private directory."""
    path = os.path.abspath(path)
    problem = _symlink_problem(path)
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return DirectoryCheck(path, problem or _ancestor_problem(path))
    except OSError:  # not a directory on the way, no permission: unusable, which writes will say
        return DirectoryCheck(path, problem)
    # Not a directory, but yours: nothing can be written there, which the cache says when it tries.
    problem = problem or _own_problem(status) or _ancestor_problem(path)
    return DirectoryCheck(path, problem, status.st_uid, stat.S_IMODE(status.st_mode))


def make_directory(path: str, mode: int = PRIVATE_DIRECTORY_MODE) -> DirectoryCheck:
    """Create ``path`` where missing, each new component with ``mode`` (less the umask), then check
    it. Raises OSError when it cannot be created."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.lexists(path) and path != os.path.dirname(path):
        missing.append(path)
        path = os.path.dirname(path)
    for component in reversed(missing):
        try:
            os.mkdir(component, mode)
        except FileExistsError:
            pass  # made meanwhile, by us or by someone else: the check below tells
    return check_directory(missing[0] if missing else path)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one of the cache's directories is: ``path`` (None: nowhere safe), its ``state``, and the
    directory ``asked`` for (named by ``variable``, or the default) when another is used instead."""
    path: str | None
    state: str
    check: DirectoryCheck
    asked: DirectoryCheck | None = None
    variable: str = ""

    def describe(self) -> str:
        used = "nowhere" if self.path is None else f"{self.path} ({self.check.describe()}): {self.state}"
        if self.asked is None:
            return used
        return f"{used}; not {self.asked.path} ({self.asked.describe()}: {self.asked.problem})"


def fallbacks(name: str) -> list[str]:
    """Per-user places for directory ``name`` when the one asked for is refused."""
    uid = os.geteuid()
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(tempfile.gettempdir(), f"{name}-{uid}"), os.path.join(home, "torch_neuronx", name)]


def place(named: str | None, default: str, variable: str, what: str, verified: bool = False,
          fallback: bool = True, hint: str = "") -> Placement:
    """Where the directory ``named`` by ``variable`` (else ``default``) is used, as the module's
    docstring says: ``verified`` when its entries are checked with a key; without ``fallback`` the
    directory asked for is examined, never replaced (``neuron-cache --dir``). ``hint`` ends the
    warning's list of fixes."""
    asked = check_directory(named or default)
    if asked.private:
        return Placement(asked.path, PRIVATE, asked, variable=variable)
    if verified:
        return Placement(asked.path, SHARED, asked, variable=variable)
    if named and env_flag(TRUST_ENV, default=False):
        return Placement(asked.path, TRUSTED, asked, variable=variable)
    if not fallback:
        return Placement(asked.path, REFUSED, asked, variable=variable)
    for candidate in fallbacks(os.path.basename(default)):
        check = check_directory(candidate)
        if check.private and check.path != asked.path:
            _warn_refused(what, variable, asked, check.path, hint)
            return Placement(check.path, PRIVATE, check, asked, variable)
    _warn_refused(what, variable, asked, None, hint)
    return Placement(None, REFUSED, asked, asked, variable)


def _warn_refused(what: str, variable: str, asked: DirectoryCheck, used: str | None, hint: str) -> None:
    instead = f"using {used} instead" if used else "no directory of your own could be found, so nothing is kept"
    warn_once(("refused", variable, asked.path),
              f"torch_neuronx: not using {asked.path} as the {what}: {asked.problem} ({asked.describe()}), so "
              f"another user could put code there that would run as you; {instead}. To choose a directory, set "
              f"{variable} to one only you can write (created 0700 if missing){hint}; to use this one anyway, "
              f"name it in {variable} and set {TRUST_ENV}=1.", stacklevel=4)
