"""The executors of compiled graphs, by the name ``TORCH_NEURONX_COMPILE_EXECUTOR`` (or
``options={"executor": ...}``) gives: each a module with ``compile_graph(host, settings, metrics)``
returning (the compiled graph, whether Dynamo's package of the function now holds it).

- ``inductor`` (the default, :mod:`.inductor`): Inductor's CPU code, equal to
  ``torch.compile(backend="inductor")`` on CPU bit for bit;
- ``xla`` (:mod:`.xla`): TorchNeuron's own front end (``faithful/``) and XLA:CPU, computing what
  Trainium would be given.

A module is imported when its executor is first chosen, so the default path never loads the
faithful front end (nor torch-mlir and jax) unless the readiness report asks for a lowering.
"""
from __future__ import annotations

import importlib
from types import ModuleType

EXECUTORS = {"inductor": "torch_neuronx.neuron_dynamo_backend.executors.inductor",
             "xla": "torch_neuronx.neuron_dynamo_backend.executors.xla"}


def executor_module(name: str) -> ModuleType:
    """The module of executor ``name`` (one of :data:`EXECUTORS`, as config.executor checked)."""
    return importlib.import_module(EXECUTORS[name])
