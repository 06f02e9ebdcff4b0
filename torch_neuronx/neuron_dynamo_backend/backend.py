"""``torch.compile(backend="neuron")``: TorchNeuron's compiled mode, executed on the host.

Dynamo hands over a graph of neuron tensors. :func:`neuron_backend` checks the arguments, makes it a
CPU graph (:mod:`.host_graph`), lowers it as TorchNeuron would when the readiness report or the
artifacts want it and the executor does not lower it itself, compiles it with the chosen executor
(:mod:`.executors`, each an :class:`~.executors.Executor`) and wraps the result so it runs on the
neuron tensors' own bytes (:mod:`.bridge`).
Compiled graphs are kept in the compile cache like TorchNeuron's NEFFs (:mod:`.caching`).

TorchNeuron's contract, kept here: static shapes (``dynamic=True`` is an error; each new input
shape compiles once; Dynamo's automatic dynamic shapes are turned off when this module loads),
``mode`` other than "default" warned and ignored, ``options={"fallback_execution", "model_name"}``,
``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION`` (default: a compile failure raises
:class:`NEFFCompilationError`; "0": warn and run the graph eagerly), per-graph metrics.
"""
from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Callable

import torch
import torch._dynamo

from torch_neuronx.neuron_dynamo_backend import bridge, config, executors, host_graph
from torch_neuronx.neuron_dynamo_backend import metrics as graph_metrics
from torch_neuronx.neuron_dynamo_backend.caching import precompile
from torch_neuronx.neuron_dynamo_backend.exceptions import NEFFCompilationError
from torch_neuronx.runtime import hooks, warn_once

# Static shapes, as TorchNeuron: a new shape compiles a new graph instead of a dynamic one.
torch._dynamo.config.automatic_dynamic_shapes = False

_warned_modes: set[str] = set()


def _check_arguments(example_inputs, mode: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    options = dict(options or {})
    unknown = sorted(set(options) - set(config.KNOWN_OPTIONS))
    if unknown:
        raise ValueError(f"torch.compile(backend='neuron') got unknown options {unknown}; the known options are "
                         f"{list(config.KNOWN_OPTIONS)}")
    if mode not in (None, "default") and mode not in _warned_modes:
        _warned_modes.add(mode)
        warnings.warn(f"torch.compile(backend='neuron') ignores mode={mode!r}: only 'default' exists on neuron",
                      UserWarning, stacklevel=3)
    dynamic = any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
        isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride()))) for v in example_inputs)
    if dynamic or not torch._dynamo.config.assume_static_by_default:
        raise NEFFCompilationError(
            "torch.compile(backend='neuron', dynamic=True) is not supported: TorchNeuron compiles static shapes. "
            "Use dynamic=False (or leave it unset): each new input shape compiles once and is reused after.")
    return options


def _has_collectives(gm: torch.fx.GraphModule) -> bool:
    return host_graph.first_collective(gm) is not None


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                   options: dict[str, Any] | None = None) -> Callable:
    """The ``neuron`` Dynamo backend: check, host graph, compile for the chosen executor, wrap."""
    options = _check_arguments(example_inputs, mode, options)
    settings, metrics = _settings(gm, options)
    if hooks.graph_simulator is not None:  # the plan simulator: fake tensors, nothing to compile
        return hooks.graph_simulator(gm, example_inputs, metrics.graph_name)
    observer = hooks.compiled_graph_observer  # diagnostics, when they observe: cost each call of this graph
    try:
        start = time.perf_counter()
        executor = executors.executor(config.executor(options))
        if _has_subclasses(example_inputs):
            call = _compile_unwrapping_subclasses(gm, example_inputs, executor, settings, metrics, observer)
            packaged = False
        else:
            if observer is not None:
                observer.record_compiled_graph(metrics.graph_name, gm, example_inputs)
            host = host_graph.for_host(gm, example_inputs)
            metrics.fx_passes_us = (time.perf_counter() - start) * 1e6
            readiness_s = 0.0 if executor.lowers_as_torchneuron else _lower_for_readiness(host.gm, host.inputs,
                                                                                           settings, None)
            compiled, packaged = executor.compile_graph(host, settings, metrics)
            metrics.lower_us += readiness_s * 1e6
            call = bridge.run_graph_on_neuron(compiled, host.lifted)
    except Exception as error:
        return _fall_back(error, gm, metrics, config.fallback_allowed(options))
    call = bridge.apply_device_rules(call, config.refuse_cpu_inputs(), config.retain_device_mode())
    if packaged:
        call = precompile.saving_on_first_call(call)
    return call if observer is None else observer.count_calls(metrics.graph_name, call)


def _settings(gm: torch.fx.GraphModule, options: dict[str, Any]) -> tuple[config.CompileSettings,
                                                                          graph_metrics.GraphMetrics]:
    """How this graph compiles (model name, compiler arguments, the report's hook) and its metrics entry."""
    model_name = options.get("model_name", config.get_model_name())
    settings = config.CompileSettings(model_name, config.compiler_args(options))
    metrics = graph_metrics.new_graph(
        model_name=model_name, has_collectives=_has_collectives(gm),
        graph_node_count=sum(1 for n in gm.graph.nodes if n.op == "call_function"))
    observer = hooks.compiled_graph_observer
    if observer is not None:
        settings.on_lowered = functools.partial(observer.record_lowering, metrics.graph_name)
        settings.on_backward_graph = functools.partial(observer.record_backward_graph, metrics.graph_name)
    return settings, metrics


def _lower_for_readiness(gm: torch.fx.GraphModule, inputs, settings: config.CompileSettings,
                         kind: str | None) -> float:
    """The readiness step: while the report observes (``settings.on_lowered``) or artifacts are kept,
    a graph whose executor does not lower it as TorchNeuron would (``lowers_as_torchneuron``) is
    lowered to StableHLO here: a Dynamo graph (``kind`` None) through AOTAutograd, or one graph
    AOTAutograd already made (its ``kind``). Whatever happens here, the graph still compiles and runs.
    Returns the seconds taken."""
    if settings.on_lowered is None and not config.artifacts_preserved():
        return 0.0
    from torch_neuronx.neuron_dynamo_backend import faithful

    start = time.perf_counter()
    try:
        if kind is None:
            faithful.lower_for_readiness(host_graph.copy_graph_module(gm), inputs, settings)
        else:
            faithful.lower_aot_graph(gm, inputs, settings, kind)
    except Exception as error:  # noqa: BLE001 - a check, never a failure of the compile
        if settings.on_lowered is not None:
            settings.on_lowered(error, 0.0, kind or "graph")
        else:
            warn_once(("lowering", type(error).__name__), f"torch_neuronx: {config.PRESERVE_ARTIFACTS_ENV} is "
                      f"set, but the graph could not be lowered to StableHLO: {error}")
    return time.perf_counter() - start


def _fall_back(error: Exception, gm: torch.fx.GraphModule, metrics: graph_metrics.GraphMetrics,
               allowed: bool) -> Callable:
    """A graph that did not compile: NEFFCompilationError, or (fallback execution on) the graph run eagerly."""
    if not allowed:
        raise NEFFCompilationError(
            f"neuron failed to compile graph {metrics.graph_name}: {type(error).__name__}: {error}. Set "
            f"{config.FALLBACK_ENV}=0 (or options={{'fallback_execution': True}}) to run it eagerly instead."
        ) from error
    warnings.warn(f"neuron failed to compile graph {metrics.graph_name} ({type(error).__name__}: {error}); "
                  "running it eagerly", RuntimeWarning, stacklevel=3)
    metrics.fell_back = True
    return gm.forward  # the neuron graph, run eagerly


def _has_subclasses(example_inputs) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return any(is_traceable_wrapper_subclass(x) for x in example_inputs)


def _compile_unwrapping_subclasses(gm: torch.fx.GraphModule, example_inputs, executor: executors.Executor,
                                   settings: config.CompileSettings, metrics: graph_metrics.GraphMetrics,
                                   observer) -> Callable:
    """A graph with tensor-subclass inputs (the DTensor parameters of a tensor-parallel model), for
    inference and training. AOTAutograd unwraps the subclasses on the neuron fakes, where their device
    mesh is neuron, and hands over plain graphs (the forward and the backward, or the inference graph;
    DTensor's collectives as functional ops), each with this rank's shapes. Each goes the way of any
    graph: recorded and lowered for the report, rewritten to CPU and compiled by the chosen executor."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
    from torch._guards import detect_fake_mode

    def compile_plain(plain: torch.fx.GraphModule, plain_inputs, kind: str) -> Callable:
        metrics.has_collectives = metrics.has_collectives or _has_collectives(plain)  # DTensor's, now explicit
        if observer is not None and kind != "backward":
            observer.record_compiled_graph(metrics.graph_name, plain, plain_inputs)
        fake_mode = detect_fake_mode(plain_inputs)
        host_graph.rewrite_to_cpu(plain, fake_mode)
        cpu_inputs = host_graph.cpu_example_inputs(plain_inputs, fake_mode)
        if not executor.lowers_as_torchneuron:  # else it lowers (and hands the backward over) itself
            metrics.lower_us += _lower_for_readiness(plain, cpu_inputs, settings, kind) * 1e6
        compiled = executor.compile_plain_graph(plain, cpu_inputs, settings, metrics, kind)
        return make_boxed_func(bridge.run_graph_on_neuron(compiled))

    start, added_before = time.perf_counter(), metrics.compile_us + metrics.lower_us
    compiled = aot_module_simplified(
        gm, example_inputs, fw_compiler=functools.partial(compile_plain, kind="forward"),
        bw_compiler=functools.partial(compile_plain, kind="backward"),
        inference_compiler=functools.partial(compile_plain, kind="inference"),
        decompositions=executor.decompositions(), keep_inference_input_mutations=True)
    # AOTAutograd's own tracing and partitioning, on top of what the plain graphs' compiles and
    # lowerings added (a backward compiled later, at the first backward, adds its own then).
    added_us = metrics.compile_us + metrics.lower_us - added_before
    metrics.compile_us += max(0.0, (time.perf_counter() - start) * 1e6 - added_us)
    return compiled


def create_neuron_backend(**options) -> Callable:
    """A ``neuron`` backend with ``options`` bound: ``torch.compile(m, backend=create_neuron_backend(...))``."""
    _check_arguments((), None, options)
    return functools.partial(neuron_backend, options=options)
