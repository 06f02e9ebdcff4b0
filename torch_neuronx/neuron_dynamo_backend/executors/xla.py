"""The ``xla`` executor: the host graph compiled TorchNeuron's way (AOTAutograd with its
decompositions, torch-mlir, StableHLO and its semantic pass: ``faithful/``) and run by XLA:CPU."""
from __future__ import annotations

from typing import Callable

from torch_neuronx.neuron_dynamo_backend import faithful
from torch_neuronx.neuron_dynamo_backend.config import CompileSettings
from torch_neuronx.neuron_dynamo_backend.host_graph import HostGraph
from torch_neuronx.neuron_dynamo_backend.metrics import GraphMetrics


def compile_graph(host: HostGraph, settings: CompileSettings, metrics: GraphMetrics) -> tuple[Callable, bool]:
    """(the compiled graph, False: its programs live in the compile cache, not in Dynamo's package)."""
    return faithful.compile_for_xla(host, settings, metrics), False
