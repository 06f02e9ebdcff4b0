"""Which ranks need their own run: the rank audit and the relabelling of one rank's record.

A rank's program can differ from rank 0's only through what tells it its rank. In structure mode
the simulator hands out every such value itself (:func:`audited_sources`): ``dist.get_rank()``,
``ProcessGroup.rank()``, ``get_node_local_rank()``, ``get_process_group_ranks()``,
``DeviceMesh.get_rank/get_local_rank/get_coordinate``, ``torch.neuron.current_device()`` and
``torch.accelerator.current_device_index()`` (a rank's core is ``neuron:<LOCAL_RANK>``, see
world.py) and the variables RANK, LOCAL_RANK, GROUP_RANK and ROLE_RANK.
They come back as :class:`RankInt` / :class:`RankStr`, which behave as the int / str they hold but note every use made of them by code
outside torch, torch_neuronx and the standard library (the program and its other libraries):
a comparison, arithmetic, truth test, hash, formatting, ``str()``, a string method, and ``int()``
of a variable (Python makes its result a plain int, whose uses cannot be followed). Handing a
RankInt to torch unread (``torch.neuron.set_device(dist.get_rank())``) is not a use: C code
reads an int's value without calling back.

The argument, and what it rests on:
1. If the program never used its rank (no notes on rank 0's run), its own control flow and the
   shapes it chose are the same on every rank.
2. torch's own code (DeviceMesh, DTensor, FSDP2) does use the rank, but SPMD-wise: each rank's
   calls are the same with its groups translated, except where a dimension does not divide evenly
   among a group's ranks (torch.chunk gives the first ranks full chunks and the last a smaller one
   or none). Rank 0 holds a full chunk of every sharded dimension; the last rank (the last
   coordinate on every mesh dimension) holds a full one only if the split is even. So the last
   rank also runs, and its record must equal rank 0's relabelled to it (:func:`relabel`): same
   peak, allocations, ops, shapes and lines, and each group replaced by the translate of rank 0's
   group that holds it (DeviceMesh's groups tile the world by translation).
3. Then every other rank's record is rank 0's relabelled. Otherwise every rank runs (the safe path).

What this cannot see (and a full run would): a rank that reaches the program through torch as a
plain int, a process group's name, a rank used only inside C code
(``torch.zeros(rank)``, ``range(rank)``, ``"%d" % rank``, ``json.dumps``) in a way that rank 0 and
the last rank happen to agree on. ``--all-ranks`` runs every rank regardless.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import os

import torch
import torch.distributed as dist

from torch_neuronx.runtime import frames
from torch_neuronx.runtime.rows import jsonable

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK")
MAX_NOTES = 20


class Audit:
    """The uses of rank values by the program's own code, as 'file:line: what'."""

    def __init__(self):
        self.notes: list[str] = []
        self.count = 0

    def note(self, what, depth: int = 2) -> None:
        """``what()`` describes the use; called only for the program's own frames."""
        for frame in frames.outward(depth):  # the first frame outside this file
            if frame.f_code.co_filename != __file__:
                break
        else:
            return
        name = frame.f_code.co_filename
        if frames.is_library(name, stdlib=True):
            return  # torch's own SPMD code, or printing/logging
        self.count += 1
        if len(self.notes) < MAX_NOTES:
            text = f"{os.path.basename(name)}:{frame.f_lineno}: {what()}"
            if text not in self.notes:
                self.notes.append(text)


_audit: Audit | None = None


def _noting(name, base):
    original = getattr(base, name)

    def method(self, *args, **kwargs):
        if _audit is not None:
            _audit.note(lambda: f"{name} of {self._source} ({base.__repr__(self)})")
        return original(self, *args, **kwargs)  # int's / str's own method: no note, no recursion

    method.__name__ = name
    return method


class RankInt(int):
    """An int the simulator handed out as (part of) the rank; notes each use by the program."""
    _source = "a rank"

    def __new__(cls, value, source="a rank"):
        if isinstance(value, int):
            value = int.__int__(value)  # int's own conversion: a RankInt's __int__ would note a use
        obj = super().__new__(cls, value)
        obj._source = source
        return obj

    def __reduce__(self):  # pickles (and deep-copies) as a plain int
        return (int, (int(self),))


class RankStr(str):
    """A torchrun variable's value (RANK, LOCAL_RANK, ...); notes each use by the program."""
    _source = "a rank variable"

    def __new__(cls, value, source="a rank variable"):
        obj = super().__new__(cls, value)
        obj._source = source
        return obj

    def __int__(self):
        # Python turns whatever __int__ returns into a plain int, so the rank's later uses cannot be
        # seen: converting it counts as a use.
        if _audit is not None:
            _audit.note(lambda: f"int() of {self._source}")
        return int(str.__str__(self))

    def __getattribute__(self, name):
        if not name.startswith("_") and _audit is not None:
            _audit.note(lambda: f"str.{name} of {self._source}")
        return super().__getattribute__(name)

    def __reduce__(self):
        return (str, (str.__str__(self),))


_INT_USES = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__str__",
             "__repr__", "__format__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
             "__floordiv__", "__rfloordiv__", "__truediv__", "__rtruediv__", "__mod__", "__rmod__", "__divmod__",
             "__rdivmod__", "__pow__", "__rpow__", "__neg__", "__pos__", "__abs__", "__invert__", "__and__",
             "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__",
             "__rrshift__", "__float__", "__round__", "__trunc__", "__floor__", "__ceil__", "__index__",
             "__int__", "bit_length", "to_bytes", "as_integer_ratio")
_STR_USES = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__str__", "__repr__",
             "__format__", "__add__", "__mul__", "__rmul__", "__mod__", "__rmod__", "__getitem__", "__len__",
             "__iter__", "__contains__")
for _name in _INT_USES:
    setattr(RankInt, _name, _noting(_name, int))
for _name in _STR_USES:
    setattr(RankStr, _name, _noting(_name, str))
RankInt.__hash__ = _noting("__hash__", int)
RankStr.__hash__ = _noting("__hash__", str)


def _wrap(value, source):
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return RankInt(value, source)
    if isinstance(value, (list, tuple)):
        return type(value)(_wrap(v, source) for v in value)
    return value


def _returning_rank(f, source):
    @functools.wraps(f)
    def call(*args, **kwargs):
        return _wrap(f(*args, **kwargs), source)
    return call


@contextlib.contextmanager
def audited_sources(audit: Audit):
    """Hand out every rank value as a RankInt / RankStr noting its uses in ``audit``."""
    global _audit
    from torch.distributed import device_mesh

    saved = []

    def patch(target, name, source):
        original = getattr(target, name)
        saved.append((target, name, original))
        setattr(target, name, _returning_rank(original, source))

    environ_getitem = os._Environ.__getitem__

    def getitem(self, key):
        value = environ_getitem(self, key)
        return RankStr(value, f"${key}") if key in RANK_VARIABLES and self is os.environ else value

    patch(dist, "get_rank", "dist.get_rank()")
    patch(dist.distributed_c10d, "get_rank", "dist.get_rank()")
    patch(dist.ProcessGroup, "rank", "ProcessGroup.rank()")
    patch(dist, "get_process_group_ranks", "get_process_group_ranks()")
    patch(dist.distributed_c10d, "get_process_group_ranks", "get_process_group_ranks()")
    if hasattr(dist, "get_node_local_rank"):
        patch(dist, "get_node_local_rank", "get_node_local_rank()")
    for name in ("get_rank", "get_local_rank", "get_coordinate"):
        patch(device_mesh.DeviceMesh, name, f"DeviceMesh.{name}()")
    patch(torch.neuron, "current_device", "torch.neuron.current_device()")
    patch(torch.accelerator, "current_device_index", "torch.accelerator.current_device_index()")
    os._Environ.__getitem__ = getitem
    _audit = audit
    try:
        yield audit
    finally:
        _audit = None
        os._Environ.__getitem__ = environ_getitem
        for target, name, original in reversed(saved):
            setattr(target, name, original)


# ---------------------------------------------------------------- relabelling


class Tiling:
    """The groups of every rank, as translates of rank 0's: a DeviceMesh's groups along some of its
    dimensions tile the world (TP {0..7}: {8..15}, ...; FSDP {0,8,..,56}: {1,9,..,57}, ...)."""

    def __init__(self, world: int):
        self.world = world
        self._of: dict[tuple, dict[int, tuple] | None] = {}

    def group_of(self, group: tuple, rank: int) -> tuple | None:
        """The translate of ``group`` (a group of rank 0) that holds ``rank``; None if none tiles."""
        if group not in self._of:
            self._of[group] = self._tile(group)
        tiles = self._of[group]
        return None if tiles is None else tiles.get(rank)

    def _tile(self, group):
        if not group or group[0] != 0 or len(set(group)) != len(group):
            return None
        offsets = sorted(group)
        left, tiles = set(range(self.world)), {}
        while left:
            base = min(left)
            tile = tuple(base + o for o in offsets)
            if not set(tile) <= left:
                return None
            left -= set(tile)
            for r in tile:
                tiles[r] = tuple(base + g for g in group)
        return tiles


def relabel(record, rank: int, tiling: Tiling):
    """Rank 0's record as rank ``rank``'s, or None when one of its groups does not tile the world."""
    out = copy.copy(record)
    out.rank = rank
    out.collectives = []
    for c in record.collectives:
        ranks = tiling.group_of(c.ranks, rank) if c.ranks else c.ranks
        if ranks is None:
            return None
        out.collectives.append(copy.copy(c))
        out.collectives[-1].ranks = ranks
    return out


def relabel_lightly(record, rank: int, tiling: Tiling):
    """Rank 0's record as rank ``rank``'s for the plan, without copying its collectives: they
    are shared, and ``group_map`` names each of rank 0's groups' translate that holds ``rank``
    (the plan reads them through costing.grouped_collectives). None when a group does not tile."""
    out = copy.copy(record)
    out.rank, out.relabelled_from, out.group_map = rank, record.rank, {}
    for group in {c.ranks for c in record.collectives if c.ranks}:
        translated = tiling.group_of(group, rank)
        if translated is None:
            return None
        out.group_map[group] = translated
    return out


def same_record(a, b) -> str | None:
    """None when two records agree, else the first difference (for the plan)."""
    for field in ("peak_bytes", "allocations", "error", "error_line", "work", "launches", "steps"):
        if getattr(a, field) != getattr(b, field):  # shown as the plan's JSON holds them (steps: their dicts)
            return f"{field}: {jsonable(getattr(a, field))} vs {jsonable(getattr(b, field))}"
    if (a.over is None) != (b.over is None) or (a.over and (a.over.line, a.over.bytes_live) !=
                                                (b.over.line, b.over.bytes_live)):
        return "the allocation over HBM"
    if len(a.collectives) != len(b.collectives):
        return f"{len(a.collectives)} vs {len(b.collectives)} collectives"
    for i, (x, y) in enumerate(zip(a.collectives, b.collectives)):
        if (x.op, x.ranks, x.bytes, x.shapes, x.line) != (y.op, y.ranks, y.bytes, y.shapes, y.line):
            return f"collective #{i}: {x.op}({x.shapes}) on {x.ranks} at {x.line} vs {y.op}({y.shapes}) on {y.ranks} " \
                   f"at {y.line}"
    return None
