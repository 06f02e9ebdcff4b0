"""Per-graph compile metrics (TorchNeuron's ``get_dynamo_metrics``): one record per graph the
backend was given, in compile order."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class GraphMetrics:
    graph_id: int
    graph_name: str
    model_name: str | None
    has_collectives: bool
    graph_node_count: int
    fx_passes_us: float = 0.0  # our FX pass: the graph rewritten to host (CPU) code
    lower_us: float = 0.0  # keying the graph and looking it up in the compile cache
    compile_us: float = 0.0  # AOTAutograd + Inductor (tracing, codegen, host compiler), or the cache load
    cache: str = "miss"  # "hit": loaded from the compile cache, nothing compiled
    fell_back: bool = False  # compile failed and the graph runs eagerly


_metrics: list[GraphMetrics] = []


def new_graph(model_name: str | None, has_collectives: bool, graph_node_count: int) -> GraphMetrics:
    """The record of the next graph, named ``neuron_graph_<n>``."""
    metrics = GraphMetrics(graph_id=len(_metrics), graph_name=f"neuron_graph_{len(_metrics)}",
                           model_name=model_name, has_collectives=has_collectives,
                           graph_node_count=graph_node_count)
    _metrics.append(metrics)
    return metrics


def get_dynamo_metrics() -> list[dict[str, Any]]:
    """One dict per compiled graph, in compile order."""
    return [dataclasses.asdict(m) for m in _metrics]


def reset_dynamo_metrics() -> None:
    _metrics.clear()
