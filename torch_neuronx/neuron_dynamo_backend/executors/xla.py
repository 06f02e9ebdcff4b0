"""The ``xla`` executor: the host graph compiled TorchNeuron's way (AOTAutograd with its
decompositions, torch-mlir, StableHLO and its semantic pass: the front end in ``faithful/``),
the program compiled by XLA:CPU (:mod:`.xla_program`) and kept in the compile cache.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch
from torch._functorch.aot_autograd import make_boxed_func

from torch_neuronx.neuron_dynamo_backend import faithful
from torch_neuronx.neuron_dynamo_backend.caching import isa_probe, neff_cache
from torch_neuronx.neuron_dynamo_backend.config import CompileSettings, artifacts_preserved
from torch_neuronx.neuron_dynamo_backend.exceptions import NEFFCompilationError
from torch_neuronx.neuron_dynamo_backend.executors import Executor, xla_program
from torch_neuronx.neuron_dynamo_backend.faithful import collectives, lowering
from torch_neuronx.neuron_dynamo_backend import host_graph
from torch_neuronx.neuron_dynamo_backend.host_graph import HostGraph
from torch_neuronx.neuron_dynamo_backend.metrics import GraphMetrics
from torch_neuronx.version import __version__

EXECUTOR_FORMAT = "2"  # bump when what is cached for the xla executor changes


def compile_graph(host: HostGraph, settings: CompileSettings, metrics: GraphMetrics) -> tuple[Callable, bool]:
    """(the compiled graph, False: its programs live in the compile cache, not in Dynamo's package)."""
    return _compile(host, settings, metrics), False


@dataclasses.dataclass
class CompileStats:
    """What compiling one Dynamo graph cost, over its AOTAutograd graphs."""
    graphs: int = 0
    hits: int = 0
    lower_s: float = 0.0
    compile_s: float = 0.0
    # The Dynamo graph's metrics record: a backward graph, compiled at the first backward call
    # after the record was filled in, adds its own lowering and compile time to it.
    metrics: Any = None


def _key(gm: torch.fx.GraphModule, example_inputs) -> str:
    import jax
    import torch_mlir

    inputs = [(tuple(t.shape), tuple(t.stride()), str(t.dtype)) if isinstance(t, torch.Tensor) else repr(t)
              for t in example_inputs]
    # The graph without its source comments (the program does not depend on where it was written),
    # and the values of its tensor constants (it does depend on those).
    code = "\n".join(line for line in gm.print_readable(print_output=False, include_stride=True).splitlines()
                     if not line.strip().startswith("#"))
    constants = [repr(getattr(gm, n.target).tolist()) for n in gm.graph.find_nodes(op="get_attr")
                 if isinstance(getattr(gm, n.target, None), torch.Tensor)]
    # XLA:CPU compiles for this host's CPU: an executable is only reloaded on the same kind of CPU.
    return neff_cache.cache_key(code, repr(constants), repr(inputs), "xla",
                                EXECUTOR_FORMAT, torch.__version__, __version__, jax.__version__,
                                getattr(torch_mlir, "__version__", "torch-mlir"),
                                ",".join(xla_program.DISABLED_XLA_PASSES), isa_probe.cpu_description())


def _program(shaped: faithful.Shaped, example_inputs, settings: CompileSettings, stats: CompileStats,
             kind: str) -> xla_program.XlaProgram:
    """The XLA program of a shaped graph: from the compile cache, or lowered and compiled (and stored)."""
    cache = neff_cache.get_cache()
    key = _key(shaped.gm, example_inputs)
    with cache.compile_lock(key):
        payload = cache.get(key)
        if payload is not None:
            try:
                start = time.perf_counter()
                program, stablehlo, op_counts = xla_program.deserialize(payload)
                stats.hits += 1
                stats.compile_s += time.perf_counter() - start
                if artifacts_preserved() and settings.keep_artifacts:  # they want every stage of the lowering
                    faithful.lower_shaped(shaped, settings, kind)
                elif settings.on_lowered is not None:  # the report wants what the entry recorded
                    settings.on_lowered(lowering.LoweredGraph("main", "", stablehlo, op_counts,
                                                              program.input_dtypes, 0.0), 0.0, kind)
                return program
            except Exception as error:  # noqa: BLE001 - a bad entry is recompiled, never fatal
                import warnings

                warnings.warn(f"[NEFF_CACHE] could not load compile cache entry {key} ({error!r}); recompiling",
                              RuntimeWarning, stacklevel=2)
        lowered = faithful.lower_shaped(shaped, settings, kind)
        stats.lower_s += lowered.seconds
        start = time.perf_counter()
        program = xla_program.compile_program(lowered.stablehlo, lowered.input_dtypes, shaped.result_dtypes)
        stats.compile_s += time.perf_counter() - start
        cache.record_compilation()
        if cache.enabled:
            cache.put(key, xla_program.serialize(program, lowered.stablehlo, lowered.op_counts))
        return program


def _runner(shaped: faithful.Shaped, program: xla_program.XlaProgram) -> Callable:
    kept = shaped.results - len(shaped.none_results)

    def run(*args):
        results = program(args)
        for index, value in zip(shaped.mutated_inputs, results[kept:]):
            args[index].copy_(value)
        outputs = iter(results[:kept])
        return [None if i in shaped.none_results else next(outputs) for i in range(shaped.results)]

    return make_boxed_func(faithful.outside_dynamo(run))


def _compile(host: HostGraph, settings: CompileSettings, metrics: GraphMetrics) -> Callable:
    """The ``xla`` executor: the host graph compiled TorchNeuron's way and run by XLA:CPU. Lowering
    and compile times go to ``metrics``, the backward graph's when it compiles at the first backward."""
    start = time.perf_counter()
    stats = CompileStats()
    compiled = _compile_with_aot(host.gm, host.inputs, settings, stats)
    metrics.lower_us = stats.lower_s * 1e6
    metrics.compile_us = (time.perf_counter() - start - stats.lower_s) * 1e6
    metrics.cache = "hit" if stats.graphs and stats.hits == stats.graphs else "miss"
    stats.metrics = metrics
    return compiled


def _compile_with_aot(gm: torch.fx.GraphModule, example_inputs, settings: CompileSettings,
                      stats: CompileStats) -> Callable:
    lowering.require_torch_mlir()
    xla_program.require_jax()

    def compile_one(aot_gm: torch.fx.GraphModule, aot_inputs, kind: str) -> Callable:
        return compile_aot_graph(aot_gm, aot_inputs, settings, stats, kind)

    return faithful.through_aot(gm, example_inputs, compile_one, wrap=faithful.outside_dynamo)


def compile_aot_graph(aot_gm: torch.fx.GraphModule, aot_inputs, settings: CompileSettings, stats: CompileStats,
                      kind: str) -> Callable:
    """One graph AOTAutograd handed over (``kind``: forward, backward or inference), on CPU fakes:
    compiled by XLA:CPU (or read from the cache) into one program, or into programs between its
    collectives (:func:`_around_collectives`); boxed, to run on CPU tensors."""
    if host_graph.first_collective(aot_gm) is None and all(
            isinstance(p.meta.get("val"), torch.Tensor) for p in aot_gm.graph.find_nodes(op="placeholder")):
        faithful.hand_over_backward(settings, aot_gm, aot_inputs, kind)
        return _runner(*_one_program(aot_gm, aot_inputs, settings, stats, kind))
    split = _around_collectives(aot_gm, aot_inputs, settings, stats, kind)
    return make_boxed_func(faithful.outside_dynamo(split))


def _one_program(aot_gm: torch.fx.GraphModule, aot_inputs, settings: CompileSettings, stats: CompileStats,
                 kind: str) -> tuple[faithful.Shaped, xla_program.XlaProgram]:
    stats.graphs += 1
    shaped = faithful.shape_for_lowering(aot_gm)
    lower_s, compile_s = stats.lower_s, stats.compile_s
    try:
        program = _program(shaped, aot_inputs, settings, stats, kind)
    except lowering.LoweringError as error:  # a backward graph is compiled at the first backward
        raise NEFFCompilationError(str(error)) from error
    if stats.metrics is not None and stats.graphs > 1:
        stats.metrics.lower_us += (stats.lower_s - lower_s) * 1e6
        stats.metrics.compile_us += (stats.compile_s - compile_s) * 1e6
    return shaped, program


def decompositions() -> dict:
    """The table AOTAutograd decomposes with for this executor: TorchNeuron's."""
    return faithful.decomposition_table()


def compile_plain_graph(plain: torch.fx.GraphModule, cpu_inputs, settings: CompileSettings, metrics: GraphMetrics,
                        kind: str) -> Callable:
    """A graph AOTAutograd made of a graph with tensor-subclass inputs (DTensor), rewritten to CPU:
    compiled as any AOTAutograd graph here."""
    lowering.require_torch_mlir()
    xla_program.require_jax()
    stats = CompileStats()
    start = time.perf_counter()
    runner = compile_aot_graph(plain, cpu_inputs, settings, stats, kind)  # boxed: takes one list
    metrics.lower_us += stats.lower_s * 1e6
    metrics.compile_us += (time.perf_counter() - start - stats.lower_s) * 1e6
    metrics.cache = "hit" if stats.hits == stats.graphs else "miss"
    return lambda *args: runner(list(args))


def _around_collectives(gm: torch.fx.GraphModule, example_inputs, settings: CompileSettings, stats: CompileStats,
                        kind: str) -> torch.fx.GraphModule:
    """A graph with collectives, or with inputs that are not tensors (the opaque DTensor metadata
    AOTAutograd passes through).

    On Trainium it is one NEFF with its collectives inside (TorchNeuron's CollectiveLegalization lowers
    all_reduce, all_gather, reduce_scatter and all_to_all; any other collective fails to compile).
    XLA:CPU runs one process's program, so here the graph runs as XLA:CPU programs between its
    collectives, which run as the graph calls them, on this process's group; what only passes through
    stays outside the programs. The report sees the whole graph lowered, as TorchNeuron lowers it, and
    not the programs between the collectives again."""
    unlowered = collectives.first_unlowered(gm)
    if unlowered is not None:
        raise NEFFCompilationError(
            f"{unlowered.target} (at {lowering.with_source(lowering.site_of(unlowered)) or 'its graph'}) does not "
            "lower: TorchNeuron compiles all_reduce, all_gather_into_tensor, reduce_scatter_tensor and "
            "all_to_all_single inside a graph, no other collective. Call it outside the compiled function.")
    segment_settings = dataclasses.replace(settings, on_backward_graph=None)  # handed over whole, here
    if host_graph.first_collective(gm) is None:
        faithful.hand_over_backward(settings, gm, example_inputs, kind)  # its one program reports itself
    else:
        segment_settings = dataclasses.replace(segment_settings, on_lowered=None, keep_artifacts=False)
        if settings.on_lowered is not None or artifacts_preserved():
            faithful.lower_aot_graph(gm, example_inputs, settings, kind)  # hands a backward graph over, too
        else:
            faithful.hand_over_backward(settings, gm, example_inputs, kind)
    split = _split_at_collectives(gm)
    for name, segment in list(split.named_children()):
        if host_graph.first_collective(segment) is None:
            setattr(split, name, _CompiledSegment(segment, segment_settings, stats, kind))
    return split


def _split_at_collectives(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` as a graph of segments, in its own order: each run of collective calls (with their
    waits) one segment, each run of other ops between them another."""
    from torch.fx.passes.split_module import split_module

    segment_of, segment, was_collective = {}, 0, None
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        is_collective = host_graph.is_collective(node)
        if was_collective is not None and is_collective != was_collective:
            segment += 1
        segment_of[node], was_collective = segment, is_collective
    return split_module(gm, None, lambda node: segment_of.get(node, 0), keep_original_order=True)


class _CompiledSegment(torch.nn.Module):
    """One segment between collectives, compiled as a graph of its own, in the split graph's place:
    it returns what split_module's caller reads (one value, or a tuple)."""

    def __init__(self, segment: torch.fx.GraphModule, settings: CompileSettings, stats: CompileStats, kind: str):
        super().__init__()
        output = segment.graph.find_nodes(op="output")[0]
        self.single = not isinstance(output.args[0], (tuple, list))
        if self.single:
            output.args = ((output.args[0],),)
            segment.recompile()
        inputs = [p.meta["val"] for p in segment.graph.find_nodes(op="placeholder")]
        self.runner = _runner(*_one_program(segment, inputs, settings, stats, kind))

    def forward(self, *args):
        results = self.runner(list(args))
        return results[0] if self.single else tuple(results)


EXECUTOR = Executor("xla", compile_graph, compile_plain_graph, decompositions, lowers_as_torchneuron=True)
