"""A compiled graph called again with the same inputs: its first call's record replayed.

A graph compiled with static shapes (``dynamic=False``) does the same work every call it is
handed inputs of the same shapes, strides, dtypes and aliasing: the same FLOPs and HBM bytes,
the same collectives, the same memory high-water mark. Dynamo has already checked the call's
guards when it picks the graph, so running its aten ops on fake tensors again (a decode step of
an 80-layer model: thousands of ops) only recomputes what the first call recorded. The recorder
replays that record instead (:meth:`recorder.RankRecorder.replay_graph`) and hands back outputs
rebuilt from their recorded layout: a new fake tensor for each output the graph allocated, a view
of the input (or earlier output) for each one that aliased it. A graph whose inputs or outputs
are symbolic or require grad is always run.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import torch


@dataclasses.dataclass
class GraphRecording:
    """What one call of a compiled graph did, to be done again for a call with the same inputs."""

    name: str
    work: Counter  # (precision, FLOPs, HBM bytes) -> calls: the fused NEFF's work
    collectives: list  # (op, ranks, bytes, shapes) in call order
    high_water: int  # bytes above the live total at the call's start that the call reached
    allocations: int  # allocations the call made besides the outputs rebuilt on replay
    outputs: list  # each output's layout (output_layouts)
    output_type: type = tuple
    events: list | None = None  # its collectives and work in order, when they can overlap (graph_overlap.py)


def _concrete(t: torch.Tensor) -> bool:
    return all(isinstance(n, int) for n in (*t.shape, *t.stride(), t.storage_offset()))


def _device(t: torch.Tensor):
    # A fake tensor's .device dispatches (prim.device) through every mode: its attribute does not.
    return getattr(t, "fake_device", None) or t.device


def _strides(t: torch.Tensor) -> tuple:
    # A dimension of size 1 is never stepped along: its stride does not change the layout.
    return tuple(0 if n == 1 else st for n, st in zip(t.shape, t.stride()))


def signature(args) -> tuple | None:
    """What makes two calls of one graph alike: each input's shape, strides, offset, dtype and
    device, which inputs share a storage, and plain values as they are; None (always run) when an
    input is symbolic or of another kind."""
    key, storages = [], {}
    for a in args:
        if isinstance(a, torch.Tensor):
            shared = storages.setdefault(a.untyped_storage()._cdata, len(storages))
            key.append((a.shape, _strides(a), a.storage_offset(), a.dtype, _device(a), a.requires_grad, shared))
        elif a is None or type(a) in (int, float, bool):
            key.append((type(a).__name__, a))
        else:
            return None
    key = tuple(key)
    try:
        hash(key)  # a symbolic size or stride (SymInt) is unhashable: such a call always runs
    except TypeError:
        return None
    return key


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset()


def output_layouts(args, outputs) -> list | None:
    """How to rebuild each output: ("value", v), ("input", i, *view) for a view of input i's
    storage, ("output", j, *view) for one of output j's, ("new", *view, dtype, device, storage
    bytes); None when an output cannot be rebuilt (symbolic, requires grad, another kind)."""
    inputs = {a.untyped_storage()._cdata: i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    made, layouts = {}, []
    for j, out in enumerate(outputs):
        if out is None or type(out) in (int, float, bool):
            layouts.append(("value", out))
            continue
        if not isinstance(out, torch.Tensor) or not _concrete(out) or out.requires_grad:
            return None
        storage = out.untyped_storage()._cdata
        if storage in inputs:
            layouts.append(("input", inputs[storage], *_layout(out)))
        elif storage in made:
            layouts.append(("output", made[storage], *_layout(out)))
        else:
            made[storage] = j
            layouts.append(("new", *_layout(out), out.dtype, out.device, out.untyped_storage().nbytes()))
    return layouts


def new_outputs(layouts) -> int:
    return sum(1 for layout in layouts if layout[0] == "new")


def rebuild(layouts, args, output_type=tuple):
    """The outputs of a replayed call, from their layouts: fresh fake tensors and views."""
    outs = []
    for layout in layouts:
        kind = layout[0]
        if kind == "value":
            outs.append(layout[1])
        elif kind in ("input", "output"):
            base = args[layout[1]] if kind == "input" else outs[layout[1]]
            outs.append(base.as_strided(*layout[2:5]))
        else:
            size, stride, offset, dtype, device, nbytes = layout[1:]
            storage = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=device)
            outs.append(storage.as_strided(size, stride, offset))
    return output_type(outs) if output_type in (tuple, list) else tuple(outs)
