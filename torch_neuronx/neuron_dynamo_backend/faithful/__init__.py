"""TorchNeuron's front end, followed faithfully: AOTAutograd with TorchNeuron's decompositions
(:mod:`.decompositions`), each forward/backward graph lowered to StableHLO (:mod:`.lowering`, run in
:mod:`.lowering_worker`, with TorchNeuron's semantic pass :mod:`.stablehlo_passes`);
:mod:`.artifacts` writes each stage in TorchNeuron's layout. Two callers: the ``xla`` executor
(``executors/xla.py``), which compiles the lowered program with XLA:CPU and runs it, and the
readiness step of the inductor executor (:func:`lower_for_readiness`), which only lowers.

Before lowering, a graph is shaped as TorchNeuron shapes it, without changing what it computes:
copies into its inputs (optimizer updates, running statistics) become extra results written back
after the call, and ``None`` results (gradients nobody needs) are dropped and restored.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Callable

import torch

from torch_neuronx.neuron_dynamo_backend.config import CompileSettings, artifacts_preserved
from torch_neuronx.neuron_dynamo_backend.faithful import artifacts, collectives, lowering, lowering_worker
from torch_neuronx.neuron_dynamo_backend.faithful.decompositions import (
    attention_as_math,
    attention_as_on_neuron,
    decomposition_table,
)

GRAPH_KINDS = ("forward", "backward", "inference")  # what AOTAutograd hands over, by its compiler


def hand_over_backward(settings: CompileSettings, aot_gm: torch.fx.GraphModule, aot_inputs, kind: str) -> None:
    if kind == "backward" and settings.on_backward_graph is not None:
        settings.on_backward_graph(aot_gm, aot_inputs)


@dataclasses.dataclass
class Shaped:
    gm: torch.fx.GraphModule
    mutated_inputs: list[int]  # input index written by each extra result, in order
    results: int  # the graph's own results, None ones included
    none_results: list[int]
    result_dtypes: list[torch.dtype]


def shape_for_lowering(gm: torch.fx.GraphModule) -> Shaped:
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
    return Shaped(gm, mutated, len(results), none_results, dtypes)


def lower_shaped(shaped: Shaped, settings: CompileSettings, kind: str) -> lowering.LoweredGraph:
    start = time.perf_counter()
    try:
        lowered = lowering_worker.lower(shaped.gm)
    except lowering.LoweringError as error:
        if settings.on_lowered is not None:
            settings.on_lowered(error, time.perf_counter() - start, kind)
        raise
    if settings.on_lowered is not None:
        settings.on_lowered(lowered, lowered.seconds, kind)
    if artifacts_preserved() and settings.keep_artifacts:
        artifacts.write(settings.model_name, shaped.gm.print_readable(print_output=False), lowered.torch_mlir,
                        lowered.stablehlo, settings.compiler_args)
    return lowered


def outside_dynamo(function: Callable) -> Callable:
    """``function`` run with Dynamo's frame evaluation off, whatever its caller: a backward graph is
    compiled and run from inside ``loss.backward()``, which may sit in a compiled function's graph
    break, where Dynamo would otherwise trace torch-mlir's and jax's Python."""
    return torch._dynamo.disable(function, reason="torch_neuronx runs its compiled programs outside Dynamo")


def through_aot(gm: torch.fx.GraphModule, example_inputs, compile_one: Callable, wrap: Callable | None = None,
                backward_now: bool = False) -> Callable:
    """AOTAutograd over a copy of ``gm`` as TorchNeuron runs it (its decomposition table, attention as
    it dispatches on a NeuronCore): ``compile_one(aot_gm, aot_inputs, kind)`` for each graph, made by
    ``wrap`` when given; ``backward_now`` makes the backward graph now, not at the first backward call.
    AOTAutograd's callable of the whole."""
    from torch._functorch.aot_autograd import aot_module_simplified

    # TorchNeuron hands AOTAutograd one compiler for every graph; each is named by its kind here.
    compilers = {kind: (wrap or (lambda f: f))(functools.partial(compile_one, kind=kind)) for kind in GRAPH_KINDS}
    eager_backward = (torch._functorch.config.patch(force_non_lazy_backward_lowering=True) if backward_now
                      else contextlib.nullcontext())
    with attention_as_math(), eager_backward:
        return aot_module_simplified(attention_as_on_neuron(copy_graph(gm)), example_inputs,
                                     fw_compiler=compilers["forward"], bw_compiler=compilers["backward"],
                                     inference_compiler=compilers["inference"], decompositions=decomposition_table(),
                                     keep_inference_input_mutations=True)


def lower_for_readiness(gm: torch.fx.GraphModule, example_inputs, settings: CompileSettings) -> None:
    """Lower every graph AOTAutograd makes of ``gm`` the way TorchNeuron would (the forward and the
    backward of a graph that trains, else the inference graph), for the report and the artifacts
    only: each result goes to ``settings.on_lowered``; nothing is compiled or run. The backward is
    lowered now, not at the first backward call."""
    def lower_one(aot_gm: torch.fx.GraphModule, aot_inputs, kind: str) -> Callable:
        lower_aot_graph(aot_gm, aot_inputs, settings, kind)
        return aot_gm.forward

    through_aot(gm, example_inputs, lower_one, backward_now=True)


def lower_aot_graph(aot_gm: torch.fx.GraphModule, aot_inputs, settings: CompileSettings, kind: str) -> None:
    """Lower one graph AOTAutograd made (``kind``: forward, backward or inference) for the report and the
    artifacts: a copy, its functional collectives as TorchNeuron's torch-mlir takes them (see
    collectives.py); each result goes to ``settings.on_lowered``. A backward graph is handed over first."""
    hand_over_backward(settings, aot_gm, aot_inputs, kind)
    checked = copy_graph(aot_gm)
    collectives.stand_in(checked)
    _drop_opaque_inputs(checked)
    try:
        lower_shaped(shape_for_lowering(checked), settings, kind)
    except lowering.LoweringError:
        pass  # reported through on_lowered
    except lowering.FrontEndMissing as missing:  # this graph is "not checked"; AOTAutograd carries on
        if settings.on_lowered is not None:
            settings.on_lowered(missing, 0.0, kind)


def _drop_opaque_inputs(gm: torch.fx.GraphModule) -> None:
    """Inputs that are not tensors (the opaque objects a DTensor's metadata becomes when AOTAutograd
    unwraps it) and that only pass through to the results: no program input, a None result. The graph
    is lowered for the report, never run."""
    output = gm.graph.find_nodes(op="output")[0]
    for node in list(gm.graph.find_nodes(op="placeholder")):
        if isinstance(node.meta.get("val"), torch.Tensor) or set(node.users) - {output}:
            continue
        output.args = (tuple(None if r is node else r for r in output.args[0]),)
        gm.graph.erase_node(node)
    gm.recompile()


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy to reshape for lowering: AOTAutograd keeps running the graph it handed over."""
    import copy

    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
