"""Checkpoint-backed neuron storage: the writers that could rewrite a mapped file in place detach it first.

A CPU tensor that safetensors left in a private mapping of its checkpoint file moves to neuron by
mapping the same file pages privately again, copy-on-write (``csrc/checkpoint_pages.cpp``): no copy,
and processes on one host share the page cache. ``torch.save`` truncates and rewrites the file it is
given, and so do safetensors' savers before 0.8 (0.8 writes a new file and renames it over, which a
mapping never sees). Before they open a path, the neuron blocks still backed by that file are copied
into anonymous memory at the same address, so the loaded model keeps its values and no page vanishes
under it. Installed when the first mapping is made; ``TORCH_NEURONX_MAP_CHECKPOINTS=0`` turns mapping
off (every move copies, as before).
"""
from __future__ import annotations

import functools
import importlib
import os

import torch

from torch_neuronx.runtime.env import env_flag

ENV = "TORCH_NEURONX_MAP_CHECKPOINTS"
# (module, function, position of the path among the positional arguments, its keyword)
_WRITERS = (("torch", "save", 1, "f"), ("safetensors.torch", "save_file", 1, "filename"),
            ("safetensors.torch", "save_model", 1, "filename"))
_library = None


def enabled() -> bool:
    """Whether moves to neuron map a checkpoint's pages (TORCH_NEURONX_MAP_CHECKPOINTS, default on)."""
    return env_flag(ENV, True)


def detach(path) -> int:
    """Copy the neuron blocks still backed by file ``path`` into memory of their own; returns how many."""
    return torch.ops.neuron._detach_checkpoint_pages(os.fspath(path))


def _guard(original, position: int, keyword: str):
    @functools.wraps(original)
    def guarded(*args, **kwargs):
        target = kwargs[keyword] if keyword in kwargs else args[position] if len(args) > position else None
        if isinstance(target, (str, os.PathLike)):
            detach(target)
        return original(*args, **kwargs)

    guarded.__neuron_guarded__ = original
    return guarded


def guard_writers() -> None:
    """Wrap the writers (those of modules not installed are skipped); once per function."""
    for module_name, function, position, keyword in _WRITERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        current = getattr(module, function, None)
        if current is not None and not hasattr(current, "__neuron_guarded__"):
            setattr(module, function, _guard(current, position, keyword))


def _first_mapping(source) -> None:  # called by the core when it maps its first checkpoint page
    guard_writers()


def install() -> None:
    global _library
    torch.ops.neuron._set_map_checkpoints(enabled())
    # A storage slice, as safetensors hands out per tensor: the core recognizes slices by its deleter.
    probe = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage(8)[0:4])
    torch.ops.neuron._set_storage_slice_probe(probe)
    if _library is None:
        _library = torch.library.Library("neuron", "IMPL")
        _library.impl("_checkpoint_pages_mapped", _first_mapping, "CPU")
