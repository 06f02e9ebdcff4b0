"""TorchNeuron's compiled path, followed faithfully: AOTAutograd with TorchNeuron's decompositions
(:mod:`.decompositions`), each forward/backward graph lowered to StableHLO (:mod:`.lowering`, run in
:mod:`.lowering_worker`, with TorchNeuron's semantic pass :mod:`.stablehlo_passes`), then either
compiled and run by XLA:CPU (:mod:`.xla_program`: the ``xla`` executor) or only lowered, as a
readiness check beside Inductor's code; :mod:`.artifacts` writes each stage in TorchNeuron's layout.

Before lowering, a graph is shaped as TorchNeuron shapes it, without changing what it computes:
copies into its inputs (optimizer updates, running statistics) become extra results written back
after the call, and ``None`` results (gradients nobody needs) are dropped and restored.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import torch

from torch_neuronx.neuron_dynamo_backend.caching import isa_probe, neff_cache
from torch_neuronx.neuron_dynamo_backend.config import CompileSettings, artifacts_preserved
from torch_neuronx.neuron_dynamo_backend.exceptions import NEFFCompilationError
from torch_neuronx.neuron_dynamo_backend.faithful import artifacts, lowering, lowering_worker, xla_program
from torch_neuronx.neuron_dynamo_backend.faithful.decompositions import (
    attention_as_math,
    attention_as_on_neuron,
    decomposition_table,
)
from torch_neuronx.neuron_dynamo_backend.host_graph import HostGraph
from torch_neuronx.neuron_dynamo_backend.metrics import GraphMetrics
from torch_neuronx.version import __version__

EXECUTOR_FORMAT = "2"
GRAPH_KINDS = ("forward", "backward", "inference")  # bump when what is cached for the xla executor changes


def _hand_over_backward(settings: CompileSettings, aot_gm: torch.fx.GraphModule, aot_inputs, kind: str) -> None:
    if kind == "backward" and settings.on_backward_graph is not None:
        settings.on_backward_graph(aot_gm, aot_inputs)


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


@dataclasses.dataclass
class _Shaped:
    gm: torch.fx.GraphModule
    mutated_inputs: list[int]  # input index written by each extra result, in order
    results: int  # the graph's own results, None ones included
    none_results: list[int]
    result_dtypes: list[torch.dtype]


def _shape_for_lowering(gm: torch.fx.GraphModule) -> _Shaped:
    """Move copies into inputs to extra results and drop None results (``gm`` is changed)."""
    graph = gm.graph
    placeholders = list(graph.find_nodes(op="placeholder"))
    output = graph.find_nodes(op="output")[0]
    results = list(output.args[0])
    mutated, extra = [], []
    for node in list(graph.nodes):
        if (node.op == "call_function" and node.target is torch.ops.aten.copy_.default
                and node.args[0] in placeholders):
            mutated.append(placeholders.index(node.args[0]))
            extra.append(node.args[1])
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    none_results = [i for i, r in enumerate(results) if r is None]
    kept = [r for r in results if r is not None]
    dtypes = [r.meta["val"].dtype for r in [*kept, *extra]]
    output.args = (tuple([*kept, *extra]),)
    gm.recompile()
    return _Shaped(gm, mutated, len(results), none_results, dtypes)


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


def _lower(shaped: _Shaped, settings: CompileSettings, kind: str) -> lowering.LoweredGraph:
    start = time.perf_counter()
    try:
        lowered = lowering_worker.lower(shaped.gm)
    except lowering.LoweringError as error:
        if settings.on_lowered is not None:
            settings.on_lowered(error, time.perf_counter() - start, kind)
        raise
    if settings.on_lowered is not None:
        settings.on_lowered(lowered, lowered.seconds, kind)
    if artifacts_preserved():
        artifacts.write(settings.model_name, shaped.gm.print_readable(print_output=False), lowered.torch_mlir,
                        lowered.stablehlo, settings.compiler_args)
    return lowered


def _program(shaped: _Shaped, example_inputs, settings: CompileSettings, stats: CompileStats,
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
                if artifacts_preserved():
                    _lower(shaped, settings, kind)  # the artifacts want every stage of the lowering itself
                elif settings.on_lowered is not None:  # the report wants what the entry recorded
                    settings.on_lowered(lowering.LoweredGraph("main", "", stablehlo, op_counts,
                                                              program.input_dtypes, 0.0), 0.0, kind)
                return program
            except Exception as error:  # noqa: BLE001 - a bad entry is recompiled, never fatal
                import warnings

                warnings.warn(f"[NEFF_CACHE] could not load compile cache entry {key} ({error!r}); recompiling",
                              RuntimeWarning, stacklevel=2)
        lowered = _lower(shaped, settings, kind)
        stats.lower_s += lowered.seconds
        start = time.perf_counter()
        program = xla_program.compile_program(lowered.stablehlo, lowered.input_dtypes, shaped.result_dtypes)
        stats.compile_s += time.perf_counter() - start
        cache.record_compilation()
        if cache.enabled:
            cache.put(key, xla_program.serialize(program, lowered.stablehlo, lowered.op_counts))
        return program


def _outside_dynamo(function: Callable) -> Callable:
    """``function`` run with Dynamo's frame evaluation off, whatever its caller: a backward graph is
    compiled and run from inside ``loss.backward()``, which may sit in a compiled function's graph
    break, where Dynamo would otherwise trace torch-mlir's and jax's Python."""
    return torch._dynamo.disable(function, reason="torch_neuronx runs its compiled programs outside Dynamo")


def _runner(shaped: _Shaped, program: xla_program.XlaProgram) -> Callable:
    from torch._functorch.aot_autograd import make_boxed_func

    kept = shaped.results - len(shaped.none_results)

    def run(*args):
        results = program(args)
        for index, value in zip(shaped.mutated_inputs, results[kept:]):
            args[index].copy_(value)
        outputs = iter(results[:kept])
        return [None if i in shaped.none_results else next(outputs) for i in range(shaped.results)]

    return make_boxed_func(_outside_dynamo(run))


def compile_for_xla(host: HostGraph, settings: CompileSettings, metrics: GraphMetrics) -> Callable:
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
    from torch._functorch.aot_autograd import aot_module_simplified

    lowering.require_torch_mlir()
    xla_program.require_jax()

    def compile_one(aot_gm: torch.fx.GraphModule, aot_inputs, kind: str) -> Callable:
        _hand_over_backward(settings, aot_gm, aot_inputs, kind)
        stats.graphs += 1
        shaped = _shape_for_lowering(aot_gm)
        lower_s, compile_s = stats.lower_s, stats.compile_s
        try:
            program = _program(shaped, aot_inputs, settings, stats, kind)
        except lowering.LoweringError as error:  # a backward graph is compiled at the first backward
            raise NEFFCompilationError(str(error)) from error
        if stats.metrics is not None and stats.graphs > 1:
            stats.metrics.lower_us += (stats.lower_s - lower_s) * 1e6
            stats.metrics.compile_us += (stats.compile_s - compile_s) * 1e6
        return _runner(shaped, program)

    # TorchNeuron hands AOTAutograd one compiler for every graph; each is named by its kind here.
    compilers = {kind: _outside_dynamo(functools.partial(compile_one, kind=kind)) for kind in GRAPH_KINDS}
    with attention_as_math():
        return aot_module_simplified(attention_as_on_neuron(copy_graph(gm)), example_inputs,
                                     fw_compiler=compilers["forward"],
                                     bw_compiler=compilers["backward"], inference_compiler=compilers["inference"],
                                     decompositions=decomposition_table(), keep_inference_input_mutations=True)


def lower_for_readiness(gm: torch.fx.GraphModule, example_inputs, settings: CompileSettings) -> None:
    """Lower every graph AOTAutograd makes of ``gm`` the way TorchNeuron would (the forward and the
    backward of a graph that trains, else the inference graph), for the report and the artifacts
    only: each result goes to ``settings.on_lowered``; nothing is compiled or run. The backward is
    lowered now, not at the first backward call."""
    from torch._functorch.aot_autograd import aot_module_simplified

    def lower_one(aot_gm: torch.fx.GraphModule, aot_inputs, kind: str) -> Callable:
        _hand_over_backward(settings, aot_gm, aot_inputs, kind)
        try:
            _lower(_shape_for_lowering(copy_graph(aot_gm)), settings, kind)
        except lowering.LoweringError:
            pass  # reported through on_lowered
        return aot_gm.forward

    compilers = {kind: functools.partial(lower_one, kind=kind) for kind in GRAPH_KINDS}
    with attention_as_math(), torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
        aot_module_simplified(attention_as_on_neuron(copy_graph(gm)), example_inputs,
                              fw_compiler=compilers["forward"], bw_compiler=compilers["backward"],
                              inference_compiler=compilers["inference"], decompositions=decomposition_table(),
                              keep_inference_input_mutations=True)


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy to reshape for lowering: AOTAutograd keeps running the graph it handed over."""
    import copy

    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
