"""The executors of compiled graphs, by the name ``TORCH_NEURONX_COMPILE_EXECUTOR`` (or
``options={"executor": ...}``) gives (the names are :data:`..config.EXECUTORS`): each module holds one
:class:`Executor`, ``EXECUTOR``.

- ``inductor`` (the default, :mod:`.inductor`): Inductor's CPU code, equal to
  ``torch.compile(backend="inductor")`` on CPU bit for bit;
- ``xla`` (:mod:`.xla`): TorchNeuron's own front end (``faithful/``) and XLA:CPU, computing what
  Trainium would be given.

A module is imported when its executor is first chosen, so the default path never loads the
faithful front end (nor torch-mlir and jax) unless the readiness report asks for a lowering.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from torch_neuronx.neuron_dynamo_backend import config

_PACKAGE = __name__


@dataclasses.dataclass(frozen=True)
class Executor:
    """What an executor does with the graphs it is given; the backend takes one path for every graph."""
    name: str
    # (HostGraph, CompileSettings, GraphMetrics) -> (the compiled graph, whether Dynamo's package of
    # the function now holds it)
    compile_graph: Callable
    # (a plain graph AOTAutograd made of one with tensor-subclass inputs, rewritten to CPU; its CPU
    # inputs; CompileSettings; GraphMetrics; its kind) -> the compiled graph, or a clear error
    compile_plain_graph: Callable
    # () -> the table AOTAutograd decomposes with for this executor
    decompositions: Callable[[], dict]
    # Whether compiling lowers each graph as TorchNeuron would anyway (the report's lowering comes
    # with it); else the backend lowers it for the report when the report observes
    lowers_as_torchneuron: bool


def executor(name: str) -> Executor:
    """Executor ``name`` (one of :data:`..config.EXECUTORS`, as :func:`..config.executor` checked)."""
    if name not in config.EXECUTORS:
        raise ValueError(f"no executor {name!r}: the executors are {', '.join(config.EXECUTORS)}")
    return importlib.import_module(f"{_PACKAGE}.{name}").EXECUTOR
