"""TorchNeuron's compiled mode, ``torch.compile(backend="neuron")``, executed on the host.

    compiled = torch.compile(model, backend="neuron")   # Dynamo finds the backend by its entry point
    torch_neuronx.neuron_dynamo_backend.set_model_name("my_model")
    torch_neuronx.neuron_dynamo_backend.get_dynamo_metrics()

The package, as TorchNeuron's: :mod:`.backend` (the Dynamo backend), :mod:`.config` (options,
model name, fallback execution, the settings an executor gets), :mod:`.exceptions`, :mod:`.metrics`,
:mod:`.host_graph` (the graph made CPU code), :mod:`.executors` (inductor, the default; xla),
:mod:`.faithful` (TorchNeuron's front end: decompositions, lowering to StableHLO, artifacts),
:mod:`.bridge` (compiled graphs run on neuron bytes) and :mod:`.caching` (the NEFF-style compile
cache). The backend itself loads torch._dynamo, so it is imported when first asked for; the rest
imports nothing heavy.
"""
import importlib

from torch_neuronx.neuron_dynamo_backend.config import get_model_name, set_model_name
from torch_neuronx.neuron_dynamo_backend.exceptions import NEFFCompilationError, NEFFExecutionError
from torch_neuronx.neuron_dynamo_backend.metrics import get_dynamo_metrics, reset_dynamo_metrics

__all__ = ["NEFFCompilationError", "NEFFExecutionError", "create_neuron_backend", "get_dynamo_metrics",
           "get_model_name", "neuron_backend", "reset_dynamo_metrics", "set_model_name"]

_FROM_BACKEND = ("create_neuron_backend", "neuron_backend")


def __getattr__(name: str):
    if name in _FROM_BACKEND:
        return getattr(importlib.import_module("torch_neuronx.neuron_dynamo_backend.backend"), name)
    raise AttributeError(f"module 'torch_neuronx.neuron_dynamo_backend' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_FROM_BACKEND])
