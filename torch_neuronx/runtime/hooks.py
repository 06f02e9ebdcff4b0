"""Where diagnostics observe the compiler. The compiler calls the observer installed here, if
any; ``torch_neuronx.diagnostics.start()`` installs it and ``stop()`` removes it. So the compiler
never imports the diagnostics, which sit above it."""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch


class CompiledGraphObserver(Protocol):
    def record_compiled_graph(self, graph_name: str, gm: torch.fx.GraphModule, example_inputs: Any) -> None:
        """Called once per graph the backend compiles, before it is compiled."""

    def count_calls(self, graph_name: str, call: Callable) -> Callable:
        """Wrap the compiled graph's entry so each call is recorded."""


compiled_graph_observer: CompiledGraphObserver | None = None


def install_compiled_graph_observer(observer: CompiledGraphObserver | None) -> None:
    global compiled_graph_observer
    compiled_graph_observer = observer
