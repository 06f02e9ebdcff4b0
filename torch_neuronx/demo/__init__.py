"""The main job (`make demo`, `neuronx-demo`, `python -m torch_neuronx.demo`): the seed's
Flux2-Klein pipeline on neuron, and the small pipelines it and the examples use (`pipelines`).

It needs more than torch: the ``demo`` extra. Checked here, so a bare install says what to add
instead of failing on the first missing import.
"""
import importlib.util

_NEEDED = ("numpy", "diffusers", "transformers", "PIL")
_missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
if _missing:
    raise ImportError(
        f"torch_neuronx.demo needs {', '.join(_missing)}, which are not installed. Install the demo's extra: "
        "pip install --no-build-isolation 'torch-neuronx-cpu[demo]' (or pip install diffusers==0.42.1 "
        "'transformers>=5,<6' numpy pillow)")
