"""Functional collectives in a graph lowered for readiness, as TorchNeuron lowers them.

TorchNeuron's ``CollectiveLegalization`` pass (``neuron_dynamo_backend/fx/passes/
collective_legalization.py``) rewrites the group of ``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor`` and ``all_to_all_single`` into explicit replica groups, and its torch-mlir (a
private release) lowers them to StableHLO collectives. The public torch-mlir (20261001) has no lowering
for ``_c10d_functional`` ops. So, for the readiness check only (the graph is lowered, never run), each of
the four becomes an aten op that reads its input and has its result's shape, and ``wait_tensor`` becomes
its input. Every other collective (``broadcast``, the coalesced forms) stays and fails to lower, as it
does on TorchNeuron (its pass leaves them: "TODO: Support broadcast").
"""
from __future__ import annotations

import torch

from torch_neuronx.neuron_dynamo_backend import host_graph

LEGALIZED = frozenset({"_c10d_functional.all_reduce.default", "_c10d_functional.all_gather_into_tensor.default",
                       "_c10d_functional.reduce_scatter_tensor.default",
                       "_c10d_functional.all_to_all_single.default"})
_WAIT = "_c10d_functional.wait_tensor.default"


def first_unlowered(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The graph's first collective that TorchNeuron's pass leaves, so that it fails to lower, or None."""
    return next((node for node in gm.graph.nodes
                 if host_graph.is_collective(node) and str(node.target) not in LEGALIZED | {_WAIT}), None)


def stand_in(gm: torch.fx.GraphModule) -> int:
    """Replace the collectives TorchNeuron lowers in ``gm`` (changed in place); returns how many."""
    graph, replaced = gm.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = str(node.target)
        if target == _WAIT:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif target in LEGALIZED:
            with graph.inserting_before(node):
                result = _same_shape_from(graph, node.args[0], node)
            node.replace_all_uses_with(result)
            graph.erase_node(node)
            replaced += 1
    if replaced:
        gm.recompile()
    return replaced


def _same_shape_from(graph: torch.fx.Graph, source: torch.fx.Node, collective: torch.fx.Node) -> torch.fx.Node:
    """An op of ``collective``'s result shape over ``source`` (the collectives change dim 0 only)."""
    aten = torch.ops.aten
    value, want = source.meta["val"], collective.meta["val"]
    have, need = value.shape[0], want.shape[0]
    if need > have and need % have == 0:  # a gather: the group's copies stacked
        node = graph.call_function(aten.repeat.default, (source, [need // have] + [1] * (value.dim() - 1)))
    elif need < have:  # a scatter: this rank's rows
        part = graph.call_function(aten.slice.Tensor, (source, 0, 0, need))
        part.meta = {**collective.meta, "val": value[:need]}
        node = graph.call_function(aten.clone.default, (part,))
    elif need > have:  # an uneven all_to_all
        node = graph.call_function(aten.constant_pad_nd.default, (source, [0, 0] * (value.dim() - 1) + [0, need - have]))
    else:
        node = graph.call_function(aten.clone.default, (source,))
    node.meta = dict(collective.meta)  # its value and its stack trace: a later failure names the user's line
    return node
