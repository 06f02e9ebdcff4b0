"""The ``inductor`` executor (the default): the host graph compiled by Inductor for CPU, as Inductor
compiles any CPU graph, through the compile cache (:mod:`..caching.graph_cache`). Results equal
``torch.compile(backend="inductor")`` on CPU bit for bit.
"""
from __future__ import annotations

import time
from typing import Callable

from torch_neuronx.neuron_dynamo_backend.caching import graph_cache, precompile
from torch_neuronx.neuron_dynamo_backend.config import CompileSettings
from torch_neuronx.neuron_dynamo_backend.executors import Executor
from torch_neuronx.neuron_dynamo_backend.host_graph import HostGraph
from torch_neuronx.neuron_dynamo_backend.metrics import GraphMetrics


def compile_graph(host: HostGraph, settings: CompileSettings, metrics: GraphMetrics) -> tuple[Callable, bool]:
    """(the compiled graph, whether Dynamo's package of the function now holds it)."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    start = time.perf_counter()
    key = graph_cache.graph_key(host.gm, host.inputs, {"grad_enabled": torch.is_grad_enabled()})
    with graph_cache.inductor_settings(graph_cache.inputs_share_storage(host.inputs)):
        compiled, hit, compile_s = graph_cache.compile_with_cache(key, lambda: compile_fx(host.gm, host.inputs))
    metrics.lower_us = (time.perf_counter() - start - compile_s) * 1e6
    metrics.compile_us = compile_s * 1e6
    metrics.cache = "hit" if hit else "miss"
    # Dynamo is packaging this function (caching precompile): give it the graph, unless lifted
    # tensors, which a new process would not have, are part of its call.
    packaged = (precompile.active() and bool(host.backend_id) and not host.lifted
                and precompile.record_graph(host.backend_id, compiled))
    return compiled, packaged


def decompositions() -> dict:
    """The table AOTAutograd decomposes with for this executor: Inductor's own."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def compile_plain_graph(plain, cpu_inputs, settings: CompileSettings, metrics: GraphMetrics, kind: str) -> Callable:
    """A graph AOTAutograd made of a graph with tensor-subclass inputs (DTensor), rewritten to CPU:
    compiled by Inductor as compile_fx compiles each graph it hands over. Not kept in the NEFF cache
    (Inductor's own FX-graph cache still applies): the key would need the subclasses' metadata."""
    from torch._inductor.compile_fx import compile_fx_inner

    start = time.perf_counter()
    with graph_cache.inductor_settings():
        output_code = compile_fx_inner(plain, cpu_inputs, is_backward=kind == "backward",
                                       is_inference=kind == "inference")
    metrics.compile_us += (time.perf_counter() - start) * 1e6
    metrics.cache = "uncached"
    return lambda *args: output_code(list(args))


EXECUTOR = Executor("inductor", compile_graph, compile_plain_graph, decompositions, lowers_as_torchneuron=False)
