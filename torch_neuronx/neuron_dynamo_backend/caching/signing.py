"""The key of a shared compile cache, and the MAC every entry carries under it.

A cache that others write (a team's directory, a CI cache restored on another machine, a tier a CI
job publishes) is verified, not trusted. With a key, every entry is written with an HMAC-SHA256
under it, and an entry whose MAC does not verify is refused, warned about and compiled again: it is
never loaded. The MAC covers the entry's name in the cache and its payload's sha256, so an entry
cannot be replayed under another name. Anyone who holds the key can write entries that will load:
give it only to those you would let run code as you.

The key is ``TORCH_NEURONX_NEFF_CACHE_KEY`` (a CI secret), or the contents of the file named by
``TORCH_NEURONX_NEFF_CACHE_KEY_FILE``; at least 16 bytes (``openssl rand -hex 32`` makes one).
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import stat

KEY_ENV = "TORCH_NEURONX_NEFF_CACHE_KEY"
KEY_FILE_ENV = "TORCH_NEURONX_NEFF_CACHE_KEY_FILE"
MIN_KEY_BYTES = 16
MAC_BYTES = 32
UNSIGNED = bytes(MAC_BYTES)
# Bump when what the MAC covers changes.
_DOMAIN = b"torch_neuronx compile cache entry, MAC format 1\0"


@dataclasses.dataclass(frozen=True)
class SigningKey:
    secret: bytes = dataclasses.field(repr=False)
    source: str  # where it came from, for messages

    def mac(self, name: str, digest: bytes) -> bytes:
        """The MAC of the entry ``name`` whose payload has sha256 ``digest``."""
        return hmac.new(self.secret, _DOMAIN + name.encode("utf-8") + b"\0" + digest, hashlib.sha256).digest()

    def verifies(self, name: str, digest: bytes, mac: bytes) -> bool:
        return hmac.compare_digest(self.mac(name, digest), mac)


def _from_file(path: str) -> bytes:
    """The key in ``path``, which only its owner may write and others may not read."""
    try:
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            secret = f.read(1 << 16)
    except OSError as error:
        raise ValueError(f"{KEY_FILE_ENV}={path!r} cannot be read ({error.strerror or error}): name a file "
                         f"that holds the shared cache's key") from None
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(f"{KEY_FILE_ENV}={path!r} is not a regular file: name the file that holds the key")
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o022 or mode & 0o004:
        raise ValueError(f"{KEY_FILE_ENV}={path!r} has mode {mode:04o}: a key that others can "
                         f"{'write' if mode & 0o022 else 'read'} lets them sign code that runs as you. "
                         f"chmod 600 (or 640 for a team's group) {path}, or use another key")
    return secret.strip()


def load() -> SigningKey | None:
    """The key the settings give, or None when there is none. Raises ValueError, naming the
    variable and the fix, for a setting that cannot be used."""
    value, path = os.environ.get(KEY_ENV, ""), os.environ.get(KEY_FILE_ENV, "")
    if value and path:
        raise ValueError(f"both {KEY_ENV} and {KEY_FILE_ENV} are set: the compile cache's key comes from one; "
                         f"unset the other")
    if not value and not path:
        return None
    secret, source = (_from_file(path), f"the file {path}") if path else (value.strip().encode(), f"${KEY_ENV}")
    if len(secret) < MIN_KEY_BYTES:
        variable = KEY_FILE_ENV if path else KEY_ENV
        raise ValueError(f"the compile cache's key from {variable} has {len(secret)} bytes; it needs at least "
                         f"{MIN_KEY_BYTES} (make one with: openssl rand -hex 32)")
    return SigningKey(secret, source)
