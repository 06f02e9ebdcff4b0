"""Loads the C++ core (``_C``), which registers the neuron kernels, allocator,
device guard and hooks with torch."""
import importlib.machinery
import os

import torch

_loaded = False

_REBUILD = ("Rebuild it against the running Python and torch: pip install --no-build-isolation --force-reinstall "
            "--no-deps torch-neuronx-cpu (from a checkout: pip install --no-build-isolation -e .)")


def core_path() -> str:
    """The core built for this interpreter: ``_C`` with one of its extension suffixes."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_C" + suffix)
        if os.path.isfile(path):
            return path
    others = sorted(name for name in os.listdir(here) if name.startswith("_C") and name.endswith((".so", ".pyd")))
    found = f" (found {', '.join(others)}, built for another Python)" if others else ""
    raise ImportError(
        f"torch_neuronx: the C++ core for this Python ({'_C' + importlib.machinery.EXTENSION_SUFFIXES[0]}) is "
        f"missing from {here}{found}. {_REBUILD}")


def load() -> None:
    global _loaded
    if _loaded:
        return
    path = core_path()
    try:
        torch.ops.load_library(path)
    except OSError as error:  # typically an undefined symbol: built against another torch
        raise ImportError(f"torch_neuronx: the C++ core {path} does not load with torch {torch.__version__}: "
                          f"{error}. {_REBUILD}") from error
    _loaded = True
