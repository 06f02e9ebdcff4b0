"""Loads the C++ core (``_C``), which registers the neuron kernels, allocator,
device guard and hooks with torch."""
import glob
import os

import torch

_loaded = False


def load() -> None:
    global _loaded
    if _loaded:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")))
    if not candidates:
        raise ImportError(
            f"torch_neuronx: the C++ core (_C*.so) is missing from {here}. "
            "Build it against the installed torch: pip install --no-build-isolation -e ."
        )
    torch.ops.load_library(candidates[0])
    _loaded = True
