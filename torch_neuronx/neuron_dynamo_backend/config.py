"""What the user chooses for compiled graphs: backend options, the model name, and whether a
graph that fails to compile may run eagerly instead."""
from __future__ import annotations

from typing import Any

from torch_neuronx.runtime import env_flag

KNOWN_OPTIONS = ("fallback_execution", "model_name")
# TorchNeuron's variable. Set (the default): a compile failure raises NEFFCompilationError;
# "0": it warns and the graph runs eagerly.
FALLBACK_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"

_model_name: str | None = None


def set_model_name(name: str | None) -> None:
    """Name the model whose graphs compile next (shown in metrics)."""
    global _model_name
    _model_name = name


def get_model_name() -> str | None:
    return _model_name


def fallback_allowed(options: dict[str, Any]) -> bool:
    """Whether a graph that fails to compile runs eagerly: the backend option, else the environment."""
    if "fallback_execution" in options:
        return bool(options["fallback_execution"])
    return not env_flag(FALLBACK_ENV, default=True)
