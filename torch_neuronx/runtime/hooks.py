"""Where diagnostics observe the compiler. The compiler calls the observer installed here, if
any; ``torch_neuronx.diagnostics.start()`` installs it and ``stop()`` removes it. So the compiler
never imports the diagnostics, which sit above it."""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch


class CompiledGraphObserver(Protocol):
    def record_compiled_graph(self, graph_name: str, gm: torch.fx.GraphModule, example_inputs: Any) -> None:
        """Called once per graph the backend compiles, before it is compiled."""

    def record_backward_graph(self, graph_name: str, gm: torch.fx.GraphModule, example_inputs: Any) -> None:
        """The backward graph AOTAutograd made of the graph, once, when it is made."""

    def count_calls(self, graph_name: str, call: Callable) -> Callable:
        """Wrap the compiled graph's entry so each call is recorded."""

    def record_lowering(self, graph_name: str, result: Any, seconds: float, kind: str) -> None:
        """The graph (one of its forward/backward parts) lowered to StableHLO, or the error that
        stopped it (an op that does not lower, or torch-mlir missing)."""


compiled_graph_observer: CompiledGraphObserver | None = None


def install_compiled_graph_observer(observer: CompiledGraphObserver | None) -> None:
    global compiled_graph_observer
    compiled_graph_observer = observer


# The plan simulator's stand-in for compiling (simulate/compiled.py): while it is set, the backend
# hands each graph to it, and runs what it returns, instead of compiling the graph for the host.
# Its arguments: the Dynamo graph, its example inputs, the graph's name.
graph_simulator: Callable[[torch.fx.GraphModule, Any, str], Callable] | None = None


def install_graph_simulator(simulator: Callable | None) -> None:
    global graph_simulator
    graph_simulator = simulator
