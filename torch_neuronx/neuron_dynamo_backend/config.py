"""What the user chooses for compiled graphs: backend options, the model name, the executor,
whether a graph that fails to compile may run eagerly instead, and whether its compilation
artifacts are kept; and :class:`CompileSettings`, what every executor is handed for one graph."""
from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any, Callable

from torch_neuronx.runtime import env_flag

KNOWN_OPTIONS = ("compiler_args", "executor", "fallback_execution", "model_name")
# TorchNeuron's: CPU tensor inputs raise instead of being taken as neuron inputs; outputs go back to
# the inputs' device. Both are read when a graph compiles.
DISABLE_CPU_AUTOCOPY_ENV = "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY"
RETAIN_DEVICE_MODE_ENV = "TORCH_NEURONX_RETAIN_DEVICE_MODE"
# inductor: Inductor's CPU code, bit-identical to CPU eager. xla: TorchNeuron's StableHLO program,
# run by XLA:CPU, computing what Trainium would be given (float64 as float32, ...).
EXECUTOR_ENV = "TORCH_NEURONX_COMPILE_EXECUTOR"
EXECUTORS = ("inductor", "xla")  # each a module of executors/ by that name
# TorchNeuron's variable. Set (the default): a compile failure raises NEFFCompilationError;
# "0": it warns and the graph runs eagerly.
FALLBACK_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"
# TorchNeuron's: keep each graph's FX, torch-mlir and StableHLO files (faithful/artifacts.py writes them).
PRESERVE_ARTIFACTS_ENV = "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"


@dataclasses.dataclass
class CompileSettings:
    """What an executor is handed for one graph besides the graph: its names and the report's hooks."""
    model_name: str | None
    compiler_args: list[str]
    # (LoweredGraph or the error, seconds, kind: forward, backward or inference): diagnostics
    on_lowered: Callable[[Any, float, str], None] | None = None
    # (the backward graph AOTAutograd made, its example inputs): diagnostics cost each backward call with it
    on_backward_graph: Callable[[Any, Any], None] | None = None
    # False for a part of a graph (the xla executor's programs between collectives): its artifacts are the graph's
    keep_artifacts: bool = True

_model_name: str | None = None


def set_model_name(name: str | None) -> None:
    """Name the model whose graphs compile next (shown in metrics)."""
    global _model_name
    _model_name = name


def get_model_name() -> str | None:
    return _model_name


def executor(options: dict[str, Any]) -> str:
    """The executor of compiled graphs: the backend option, else the environment, else inductor."""
    if "executor" in options:
        value, source = options["executor"], "options={'executor': ...}"
    else:
        value, source = os.environ.get(EXECUTOR_ENV, "").strip() or "inductor", EXECUTOR_ENV
    if not isinstance(value, str) or value.strip().lower() not in EXECUTORS:
        raise ValueError(f"{source} = {value!r} is not an executor: use 'inductor' (Inductor's CPU code, the "
                         "default) or 'xla' (TorchNeuron's StableHLO program, run by XLA:CPU)")
    return value.strip().lower()


def compiler_args(options: dict[str, Any]) -> list[str]:
    """The ``compiler_args`` option as a list: neuronx-cc arguments, recorded with the artifacts
    (there is no neuronx-cc here to pass them to)."""
    value = options.get("compiler_args", [])
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value):
        return list(value)
    raise ValueError(f"options={{'compiler_args': {value!r}}}: give a string (\"--opt-level 2\") or a list of strings")


def fallback_allowed(options: dict[str, Any]) -> bool:
    """Whether a graph that fails to compile runs eagerly: the backend option, else the environment."""
    if "fallback_execution" in options:
        return bool(options["fallback_execution"])
    return not env_flag(FALLBACK_ENV, default=True)


def refuse_cpu_inputs() -> bool:
    return env_flag(DISABLE_CPU_AUTOCOPY_ENV, default=False)


def retain_device_mode() -> bool:
    return env_flag(RETAIN_DEVICE_MODE_ENV, default=False)


def artifacts_preserved() -> bool:
    return env_flag(PRESERVE_ARTIFACTS_ENV, default=False)
