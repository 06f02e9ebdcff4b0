"""``torch.compile(backend="neuron")``: TorchNeuron's compiled mode, executed on the host.

Dynamo hands us a graph of neuron tensors. AOTAutograd (with Inductor's decompositions, joint
passes and partitioner) traces it on neuron fakes; each forward/backward graph is rewritten to
CPU (:mod:`.host_graph`) and compiled by Inductor for CPU; the result runs on the neuron tensors'
own bytes (:mod:`.executor`). Compiled graphs are cached on disk like TorchNeuron's NEFFs
(:mod:`.graph_cache`, :mod:`.cache`), keyed by the graph and everything that shapes its code.

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

from torch_neuronx.neuron_dynamo_backend import artifacts, config, executor, faithful, graph_cache, host_graph
from torch_neuronx.neuron_dynamo_backend import precompile
from torch_neuronx.neuron_dynamo_backend import metrics as graph_metrics
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
    return any(node.op == "call_function" and "c10d" in str(getattr(node.target, "namespace", node.target))
               for node in gm.graph.nodes)


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                   options: dict[str, Any] | None = None) -> Callable:
    """The ``neuron`` Dynamo backend."""
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx

    options = _check_arguments(example_inputs, mode, options)
    fallback_allowed = config.fallback_allowed(options)
    chosen_executor = config.executor(options)
    model_name = options.get("model_name", config.get_model_name())
    settings = faithful.CompileSettings(model_name, config.compiler_args(options))
    metrics = graph_metrics.new_graph(
        model_name=model_name, has_collectives=_has_collectives(gm),
        graph_node_count=sum(1 for n in gm.graph.nodes if n.op == "call_function"))
    observer = hooks.compiled_graph_observer  # diagnostics, when they observe: cost each call of this graph
    if observer is not None:
        settings.on_lowered = functools.partial(observer.record_lowering, metrics.graph_name)
    packaged = False  # the graph is in the package Dynamo keeps of this function (caching precompile)
    try:
        start = time.perf_counter()
        if _has_subclasses(example_inputs):
            if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                               for x in example_inputs):
                raise NotImplementedError(
                    "training through a compiled graph with tensor-subclass inputs (DTensor parameters of a "
                    "tensor-parallel model) is not supported on neuron yet; compile it for inference "
                    "(torch.no_grad()), or train it eagerly")
            compiled = _compile_unwrapping_subclasses(gm, example_inputs, metrics)
            metrics.compile_us = (time.perf_counter() - start) * 1e6
            metrics.cache = "uncached"
            return compiled
        fake_mode = detect_fake_mode(example_inputs)
        if observer is not None:
            observer.record_compiled_graph(metrics.graph_name, gm, example_inputs)
        host_gm = host_graph.copy_graph_module(gm)  # Dynamo still reads gm's inputs after we return
        lifted = host_graph.lift_tensor_attributes(host_gm, fake_mode, gm)
        host_graph.rewrite_to_cpu(host_gm, fake_mode)
        lifted_fakes = [n.meta["example_value"] for n in host_gm.graph.find_nodes(op="placeholder")][:len(lifted)]
        cpu_inputs = host_graph.cpu_example_inputs([*lifted_fakes, *example_inputs], fake_mode)
        rewritten = time.perf_counter()
        metrics.fx_passes_us = (rewritten - start) * 1e6
        if chosen_executor == "xla":
            stats = faithful.CompileStats()
            compiled = faithful.compile_for_xla(host_gm, cpu_inputs, settings, stats)
            metrics.lower_us = stats.lower_s * 1e6
            metrics.compile_us = (time.perf_counter() - rewritten - stats.lower_s) * 1e6
            metrics.cache = "hit" if stats.graphs and stats.hits == stats.graphs else "miss"
            stats.metrics = metrics
        else:
            if settings.on_lowered is not None or artifacts.preserved():
                _check_lowering(host_gm, cpu_inputs, settings)
            key = graph_cache.graph_key(host_gm, cpu_inputs, {"grad_enabled": torch.is_grad_enabled()})
            with graph_cache.inductor_settings(graph_cache.inputs_share_storage(cpu_inputs)):
                compiled, hit, compile_s = graph_cache.compile_with_cache(
                    key, lambda: compile_fx(host_gm, cpu_inputs))
            metrics.lower_us = (time.perf_counter() - rewritten - compile_s) * 1e6
            metrics.compile_us = compile_s * 1e6
            metrics.cache = "hit" if hit else "miss"
            # Dynamo is packaging this function (caching precompile): give it the graph, unless lifted
            # tensors, which a new process would not have, are part of its call.
            backend_id = getattr(gm, "_backend_id", None) if precompile.active() else None
            packaged = bool(backend_id) and not lifted and precompile.record_graph(backend_id, compiled)
    except Exception as error:
        if not fallback_allowed:
            raise NEFFCompilationError(
                f"neuron failed to compile graph {metrics.graph_name}: {type(error).__name__}: {error}. Set "
                f"{config.FALLBACK_ENV}=0 (or options={{'fallback_execution': True}}) to run it eagerly instead."
            ) from error
        warnings.warn(f"neuron failed to compile graph {metrics.graph_name} ({type(error).__name__}: {error}); "
                      "running it eagerly", RuntimeWarning, stacklevel=2)
        metrics.fell_back = True
        return gm.forward  # the neuron graph, run eagerly
    call = executor.apply_device_rules(executor.run_graph_on_neuron(compiled, lifted), config.refuse_cpu_inputs(),
                                       config.retain_device_mode())
    if packaged:
        call = precompile.saving_on_first_call(call)
    return call if observer is None else observer.count_calls(metrics.graph_name, call)


def _check_lowering(host_gm: torch.fx.GraphModule, cpu_inputs, settings: faithful.CompileSettings) -> None:
    """Lower the graph as TorchNeuron would, beside Inductor's code, for the readiness report and the
    artifacts. Whatever happens here, the graph still compiles and runs."""
    try:
        faithful.lower_for_readiness(host_graph.copy_graph_module(host_gm), cpu_inputs, settings)
    except Exception as error:  # noqa: BLE001 - a check, never a failure of the compile
        if settings.on_lowered is not None:
            settings.on_lowered(error, 0.0)
        else:
            warn_once(("lowering", type(error).__name__), f"torch_neuronx: {artifacts.PRESERVE_ENV} is set, but "
                      f"the graph could not be lowered to StableHLO: {error}")


def _has_subclasses(example_inputs) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return any(is_traceable_wrapper_subclass(x) for x in example_inputs)


def _compile_unwrapping_subclasses(gm: torch.fx.GraphModule, example_inputs,
                                   metrics: graph_metrics.GraphMetrics) -> Callable:
    """A graph with tensor-subclass inputs (the DTensor parameters of a tensor-parallel model),
    for inference. AOTAutograd unwraps the subclasses on the neuron fakes, where their device
    mesh is neuron, and hands over a plain graph (collectives as functional ops), which is
    rewritten to CPU and compiled like any other. Not kept in the NEFF cache (Inductor's own
    FX-graph cache still applies): the key would need the subclasses' metadata."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table

    def compile_plain(plain: torch.fx.GraphModule, plain_inputs):
        metrics.has_collectives = metrics.has_collectives or _has_collectives(plain)  # DTensor's, now explicit
        fake_mode = detect_fake_mode(plain_inputs)
        host_graph.rewrite_to_cpu(plain, fake_mode)
        with graph_cache.inductor_settings():
            output_code = compile_fx_inner(plain, host_graph.cpu_example_inputs(plain_inputs, fake_mode))
        return executor.run_graph_on_neuron(lambda *args: output_code(list(args)))

    return aot_module_simplified(gm, example_inputs, fw_compiler=compile_plain, inference_compiler=compile_plain,
                                 decompositions=select_decomp_table(), keep_inference_input_mutations=True)


def create_neuron_backend(**options) -> Callable:
    """A ``neuron`` backend with ``options`` bound: ``torch.compile(m, backend=create_neuron_backend(...))``."""
    _check_arguments((), None, options)
    return functools.partial(neuron_backend, options=options)
