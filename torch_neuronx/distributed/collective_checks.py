"""The check that all ranks of a ``neuron`` group call the same collective.

Gloo aborts a process whose peer sends a tensor of another size, and ranks that call different
collectives can hang or exchange the wrong bytes. So before Gloo sees a collective, each rank
describes its call as text ("all_reduce(float32[1024], SUM)") and compares it with every other
rank's; on a difference every rank raises naming both calls.

The comparison costs no network traffic when all ranks of the group were started on this host by
one launcher: each rank writes its description into a slot of a shared-memory board (a file in
/dev/shm, mmap'd, one per group) and reads the others' slots once they carry the same sequence
number. Otherwise the descriptions travel in one all_gather of a fixed-size byte tensor through
the group's own Gloo, so Gloo never sees mismatched sizes.

The neuron group (process_group.py) describes each collective as Gloo will run it, after
TorchNeuron's rules, so ranks that pass equivalent forms of one call compare equal.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import select
import socket
import struct
import time
import uuid

import torch
import torch.distributed as dist

TEXT_BYTES = 240  # a description longer than this is cut and ends in a digest of the whole
HEADER = struct.Struct("<qqi")  # sequence number, pid, text length
SLOT_BYTES = HEADER.size + TEXT_BYTES + (-(HEADER.size + TEXT_BYTES)) % 64
BOARD_DIR = "/dev/shm"
# A waiting rank checks its peers' processes and the timeout this often.
LIVENESS_EVERY_S = 0.1


# ---------------------------------------------------------------- describing a call

def tensor_text(t) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}[{', '.join(map(str, t.shape))}]"


def tensors_text(ts) -> str:
    flat = [t for x in ts for t in (x if isinstance(x, (list, tuple)) else [x])]
    parts = [tensor_text(t) for t in flat]
    if len(parts) > 1 and len(set(parts)) == 1:
        return f"{len(parts)} x {parts[0]}"
    return ", ".join(parts) if len(parts) <= 1 else "[" + ", ".join(parts) + "]"


def _fit(text: str) -> bytes:
    data = text.encode()
    if len(data) <= TEXT_BYTES:
        return data
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    return data[:TEXT_BYTES - 20] + b"... #" + digest.encode()[:15]


# ---------------------------------------------------------------- the exchanges

class _Board:
    """A shared-memory board: per rank, two slots (by sequence parity). A rank can be at most one
    collective ahead of the slowest (it cannot pass the next check without it), so the slot a
    peer reads is not overwritten before the reader has posted its next call. A rank that has to
    wait blocks on its own FIFO; every post writes a byte to each peer's, so the waiter wakes as
    soon as the last peer posts (a sleeping poll would wake late, and its peer would wait for it
    inside Gloo)."""

    def __init__(self, path: str, rank: int, size: int, create: bool):
        nbytes = size * 2 * SLOT_BYTES
        if create:
            for r in range(size):
                os.mkfifo(f"{path}.{r}", 0o600)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, nbytes)
            self.mem = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        # O_RDWR: opening a FIFO neither blocks for a peer nor fails without one (Linux).
        self.fifos = [os.open(f"{path}.{r}", os.O_RDWR | os.O_NONBLOCK) for r in range(size)]
        self.path, self.rank, self.size = path, rank, size
        for parity in (0, 1):  # before the first call, so peers can tell this process exited
            struct.pack_into("<q", self.mem, self._at(rank, parity) + 8, os.getpid())

    def unlink(self) -> None:
        for name in [self.path] + [f"{self.path}.{r}" for r in range(self.size)]:
            os.unlink(name)

    def _at(self, rank: int, seq: int) -> int:
        return (rank * 2 + seq % 2) * SLOT_BYTES

    def post(self, seq: int, text: bytes) -> None:
        at = self._at(self.rank, seq)
        self.mem[at + HEADER.size:at + HEADER.size + len(text)] = text
        struct.pack_into("<i", self.mem, at + 16, len(text))
        struct.pack_into("<q", self.mem, at, seq)  # last: readers take the slot when seq matches
        for r, fd in enumerate(self.fifos):
            if r != self.rank:
                try:
                    os.write(fd, b"\0")
                except BlockingIOError:  # full of wake-ups the peer has not needed: it is awake
                    pass

    def collect(self, seq: int, timeout_s: float, describe_wait) -> list[bytes]:
        start = time.monotonic()
        mine = self.fifos[self.rank]
        pending = [r for r in range(self.size) if r != self.rank]
        while True:
            pending = [r for r in pending if struct.unpack_from("<q", self.mem, self._at(r, seq))[0] != seq]
            if not pending:
                break
            if not select.select([mine], [], [], LIVENESS_EVERY_S)[0]:
                self._raise_if_gone(pending, describe_wait)
                if time.monotonic() - start > timeout_s:
                    raise RuntimeError(f"{describe_wait(pending)}: still waiting after the group's timeout "
                                       f"({timeout_s:g} s). Every rank must call the same collectives in the same order.")
                continue
            try:
                os.read(mine, 4096)  # wake-ups of earlier posts too; the slots say what is new
            except BlockingIOError:
                pass
        texts = []
        for r in range(self.size):
            at = self._at(r, seq)
            _, _, n = HEADER.unpack_from(self.mem, at)
            texts.append(bytes(self.mem[at + HEADER.size:at + HEADER.size + n]))
        return texts

    def _raise_if_gone(self, pending, describe_wait):
        for r in pending:
            pid = struct.unpack_from("<q", self.mem, self._at(r, 0) + 8)[0]
            if not _alive(pid):
                raise RuntimeError(f"{describe_wait([r])}: rank {r} (pid {pid}) exited.")


def _alive(pid: int) -> bool:
    """Whether the process runs (an exited one stays a zombie until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _host_key() -> str:
    """Ranks with the same key share /dev/shm and a pid namespace: the same host (boot), started
    by the same launcher (torchrun's node)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return uuid.uuid4().hex  # unknown: this rank shares with no one
    return f"{socket.gethostname()}|{boot}|{pidns}|{os.environ.get('GROUP_RANK', '')}|{os.path.isdir(BOARD_DIR)}"


# ---------------------------------------------------------------- the check

class CollectiveCheck:
    """Compares each collective of one group across its ranks; on a difference every rank raises
    naming both calls."""

    def __init__(self, store, rank: int, size: int, timeout):
        self.rank, self.size = rank, size
        self._seq, self._timeout_s = 0, timeout.total_seconds()
        self._board, self._sent = None, None
        store.set(f"neuron_checks/host/{rank}", _host_key())
        keys = {store.get(f"neuron_checks/host/{r}") for r in range(size)}
        if len(keys) == 1:
            self._board = self._open_board(store, rank, size)
        else:  # a Gloo of its own, so the exchange's messages and threads stay apart from the data's
            self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("neuron_checks/", store), rank, size, timeout)

    @staticmethod
    def _open_board(store, rank, size):
        if rank == 0:
            path = os.path.join(BOARD_DIR, f"torch_neuronx_checks_{os.getpid()}_{uuid.uuid4().hex}")
            board = _Board(path, rank, size, create=True)
            store.set("neuron_checks/board", path)
        else:
            path = store.get("neuron_checks/board").decode()
            board = _Board(path, rank, size, create=False)
        if store.add("neuron_checks/opened", 1) == size:
            board.unlink()  # every rank has it open; nothing is left behind when they exit
        return board

    def __call__(self, call: str, group: str) -> None:
        """Raise unless every rank of the group describes its next collective as ``call``."""
        self._seq += 1
        text = _fit(call)
        if self._board is not None:
            self._board.post(self._seq, text)
            texts = self._board.collect(self._seq, self._timeout_s, lambda ranks: self._waiting(call, group, ranks))
        else:
            texts = self._exchange(text)
        mine = texts[self.rank]
        for r, other in enumerate(texts):
            if other != mine:
                raise RuntimeError(
                    f"Detected mismatch between collectives on ranks: rank {self.rank} is running "
                    f"{call} but rank {r} is running {other.decode(errors='replace')} (collective #{self._seq} "
                    f"of group {group!r}). Every rank must call the same collectives, in the same "
                    f"order, on tensors of the same shapes and dtypes.")

    def _waiting(self, call, group, ranks):
        return (f"rank {self.rank} is running {call} (collective #{self._seq} of group {group!r}), "
                f"waiting for rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}")

    def _exchange(self, text: bytes) -> list[bytes]:
        if self._sent is None:  # fixed-size buffers, allocated once
            self._sent = torch.zeros(TEXT_BYTES, dtype=torch.uint8)
            self._gathered = torch.zeros(self.size * TEXT_BYTES, dtype=torch.uint8)
        sent = self._sent.numpy()
        sent[:] = 0  # fixed size: this exchange itself cannot mismatch
        sent[:len(text)] = bytearray(text)
        self._gloo._allgather_base(self._gathered, self._sent).wait()
        return [row.tobytes().rstrip(b"\0") for row in self._gathered.numpy().reshape(self.size, -1)]
