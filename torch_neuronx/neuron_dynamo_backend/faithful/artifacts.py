"""Compilation artifacts in TorchNeuron's layout, kept when
``TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS`` is on:

    $TORCH_NEURONX_DEBUG_DIR/fx_graphs/proc_{rank}/{model}_{timestamp}.fx.txt
                            raw/proc_{rank}/{model}_{timestamp}.torch_raw.mlir
                            stablehlo/proc_{rank}/{model}_{timestamp}.stablehlo.mlir
                            stablehlo/proc_{rank}/{model}_{timestamp}.compiler_args.txt

The debug directory defaults to a new ``neuron_backend_*`` directory in the system's temporary
directory. ``{model}`` is the model name in lower case (``model_default`` when none was given),
``{timestamp}`` is ``%Y%m%d_%H%M%S_%f`` (one per graph) and ``{rank}`` the distributed rank, or the
current device. The StableHLO file is the program neuronx-cc would compile, with source locations;
TorchNeuron writes the same modules as MLIR bytecode, these are text, which MLIR tools read alike.
Without the variable, TorchNeuron removes these files after each compile, so none are written.
"""
from __future__ import annotations

import datetime
import functools
import os
import shlex
import tempfile

import torch

DEBUG_DIR_ENV = "TORCH_NEURONX_DEBUG_DIR"
CC_FLAGS_ENV = "NEURON_CC_FLAGS"
DEFAULT_MODEL_NAME = "model_default"


@functools.cache
def _default_directory() -> str:
    return tempfile.mkdtemp(prefix="neuron_backend_")


def directory() -> str:
    return os.environ.get(DEBUG_DIR_ENV) or _default_directory()


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return torch.neuron.current_device() if torch.neuron.is_available() else 0


def write(model_name: str | None, fx_text: str, torch_mlir: str, stablehlo: str,
          compiler_args: list[str]) -> dict[str, str]:
    """Write one graph's artifacts; returns their paths by kind."""
    stem = f"{(model_name or DEFAULT_MODEL_NAME).lower()}_{datetime.datetime.now():%Y%m%d_%H%M%S_%f}"
    proc = f"proc_{_rank()}"
    flags = shlex.split(os.environ.get(CC_FLAGS_ENV, ""))
    files = {"fx_graphs": ("fx_graphs", f"{stem}.fx.txt", fx_text),
             "raw": ("raw", f"{stem}.torch_raw.mlir", torch_mlir),
             "stablehlo": ("stablehlo", f"{stem}.stablehlo.mlir", stablehlo),
             "compiler_args": ("stablehlo", f"{stem}.compiler_args.txt", shlex.join([*flags, *compiler_args]) + "\n")}
    paths = {}
    for kind, (folder, name, content) in files.items():
        path = os.path.join(directory(), folder, proc, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
        paths[kind] = path
    return paths
