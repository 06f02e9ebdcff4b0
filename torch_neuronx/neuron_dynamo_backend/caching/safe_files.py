"""Files below a checked directory, reached without following a symlink planted there.

Each component below the directory is opened relative to its parent's descriptor with
``O_NOFOLLOW``: a symlink in place of a shard directory, an entry, a library or a lock file is an
error (``ELOOP``, ``ENOTDIR``), never a way to read, create or overwrite a file elsewhere. The
directory itself may be a symlink the user chose; :mod:`.trust` checks where it leads.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import Callable, Sequence

RootCheck = Callable[[int], None]  # raises OSError for an opened root the caller may not use

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted under an entry's name must not hang the open.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a plain file name: {name!r}")


def open_directory(root: str, parts: Sequence[str] = (), create_mode: int | None = None,
                   check_root: RootCheck | None = None) -> int:
    """A descriptor of ``root/parts...``. Missing components are created with ``create_mode``
    (None: FileNotFoundError). Raises OSError where a component is a symlink or not a directory,
    or where ``check_root`` refuses the root as opened."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if check_root is not None:
            check_root(fd)
        for part in parts:
            _check_name(part)
            try:
                child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                    os.mkdir(part, create_mode, dir_fd=fd)
                child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_file(root: str, parts: Sequence[str], check_root: RootCheck | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``root/parts...`` and its status, read through one descriptor."""
    directory = open_directory(root, parts[:-1], check_root=check_root)
    try:
        _check_name(parts[-1])
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=directory)
    finally:
        os.close(directory)
    with os.fdopen(fd, "rb") as f:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise IsADirectoryError(f"not a regular file: {os.path.join(root, *parts)}")
        os.set_blocking(fd, True)
        return f.read(), status


def write_file(root: str, parts: Sequence[str], data: bytes, mode: int, directory_mode: int,
               check_root: RootCheck | None = None) -> None:
    """Write ``data`` to ``root/parts...`` so that readers see the old file or the whole new one
    (concurrent writers: the last wins). Missing directories are created with ``directory_mode``;
    the file gets exactly ``mode``. Raises OSError, leaving no temporary file behind."""
    name = parts[-1]
    _check_name(name)
    directory = open_directory(root, parts[:-1], create_mode=directory_mode, check_root=check_root)
    temporary = f".tmp-{secrets.token_hex(8)}-{name}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(fd, mode)  # the umask may have narrowed it; a shared cache wants it as asked
                f.write(data)
                f.flush()
                os.fsync(fd)
            os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise
    finally:
        os.close(directory)


def open_lock_file(root: str, name: str, check_root: RootCheck | None = None) -> int:
    """A descriptor of the lock file ``root/name`` (created 0600), never through a symlink."""
    _check_name(name)
    directory = open_directory(root, check_root=check_root)
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600,
                     dir_fd=directory)
    finally:
        os.close(directory)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"not a regular file: {os.path.join(root, name)}")
    return fd
