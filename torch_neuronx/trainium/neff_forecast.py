"""What a run on Trainium compiles and launches: the NEFF forecast, and the first-run and steady-state
ranges built on it. An estimate, with every figure's source in :func:`assumptions`.

TorchNeuron compiles one NEFF per eager kernel key and one per compiled graph:
- an eager key is the op, each tensor's shape and dtype, the values of its static arguments and the
  types of other scalars (its source, ``kernels/base.py``, ``get_cache_key``). An observed signature
  here is the op and its tensors' shapes and dtypes (its results' too, which static arguments shape);
- ``aten::mm`` is tiled along dim 0 (``python_ops/jax/config.py``, ``TilingConfig``): greedily the
  largest of 8192, 4096, ..., 128 rows that fits, a last partial tile padded to 128; each tile size is
  a NEFF and each tile a launch;
- ops TorchNeuron runs on the CPU (:mod:`torch_neuronx.python_ops.host_ops`), memory ops (views,
  copies, transfers) and calls on empty tensors compile nothing;
- a compiled graph (forward, backward) is one NEFF, launched once per call.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

from torch_neuronx.trainium.cost_model import TensorMeta
from torch_neuronx.python_ops import op_classes

MM_TILE_ROWS = (8192, 4096, 2048, 1024, 512, 256, 128)
# A third-party measurement: 1.4-5.1 s per compiled graph of 8-323 nodes (neuronx-cc). TorchNeuron's
# source publishes no per-op compile time.
COMPILE_SECONDS = (1.4, 5.1)
# No published figure: TorchNeuron's eager op goes through Python dispatch, a kernel-cache lookup and a
# runtime launch (its Adaptive Eager Execution can fuse queued ops, which lowers this); a range.
EAGER_LAUNCH_SECONDS = (20e-6, 200e-6)
# No published figure: one NEFF execution of a compiled graph by the runtime; a range.
GRAPH_LAUNCH_SECONDS = (20e-6, 100e-6)
COMPILING_KINDS = ("device", "dropout", "collective")


@dataclasses.dataclass
class Neff:
    """One NEFF of the forecast."""
    kind: str  # "eager" or "compiled"
    name: str  # the op ("aten::add.Tensor") or the compiled graph's name
    inputs: list[str]  # the tensors' shapes and dtypes (eager), or the graph's kind
    calls: int  # calls of the op (or graph) that use this NEFF
    launches: int  # NEFF executions


def mm_tiles(rows: int) -> list[int]:
    """TorchNeuron's tile schedule of ``rows`` (the tile sizes, in order)."""
    tiles, remaining = [], rows
    while remaining > 0:
        tile = next((size for size in MM_TILE_ROWS if size <= remaining), MM_TILE_ROWS[-1])
        tiles.append(tile)
        remaining -= tile
    return tiles


def compiles(op: str, inputs: tuple[TensorMeta, ...]) -> bool:
    """Whether TorchNeuron compiles a NEFF for this eager call."""
    if op_classes.op_kind(op) not in COMPILING_KINDS:
        return False
    return not any(m.shape and 0 in m.shape for m in inputs)


def eager_neffs(op: str, inputs: tuple[TensorMeta, ...], calls: int) -> list[Neff]:
    """The NEFFs one eager signature needs, with its launches over ``calls`` calls."""
    if not compiles(op, inputs):
        return []
    if op.split(".")[0] == "aten::mm" and len(inputs) == 2 and len(inputs[0].shape) == 2:
        a, b = inputs
        per_tile = Counter(mm_tiles(a.shape[0]))
        return [Neff("eager", op, [str(TensorMeta((tile, a.shape[1]), a.dtype, a.device)), str(b)], calls,
                     calls * n) for tile, n in per_tile.items()]
    return [Neff("eager", op, [str(m) for m in inputs], calls, calls)]


def forecast(signatures: dict[tuple, int], graphs: list[tuple[str, str, int]]) -> list[Neff]:
    """Every NEFF: of the eager signatures (op, input metas) -> calls, merged by key (mm's tiles are
    shared between signatures), then one per compiled graph (name, kind, calls)."""
    merged: dict[tuple, Neff] = {}
    for (op, inputs), calls in signatures.items():
        for neff in eager_neffs(op, inputs, calls):
            key = (neff.name, tuple(neff.inputs))
            if key in merged:
                merged[key].calls += neff.calls
                merged[key].launches += neff.launches
            else:
                merged[key] = neff
    ordered = sorted(merged.values(), key=lambda n: (-n.launches, n.name))
    return ordered + [Neff("compiled", name, [kind], calls, calls) for name, kind, calls in graphs]


def launch_counts(neffs: list[Neff]) -> tuple[int, int]:
    """(eager NEFF launches, compiled graph launches) of one run."""
    return (sum(n.launches for n in neffs if n.kind == "eager"),
            sum(n.launches for n in neffs if n.kind == "compiled"))


def first_run_seconds(steady_s: float, neffs: list[Neff]) -> tuple[float, float]:
    """A cold run: every NEFF compiled once (a range of compile times), then a warm run of ``steady_s``."""
    return len(neffs) * COMPILE_SECONDS[0] + steady_s, len(neffs) * COMPILE_SECONDS[1] + steady_s


def assumptions() -> list[str]:
    return [
        "NEFFs: one per eager kernel key (op, tensor shapes and dtypes, static arguments; TorchNeuron 0.1.0's "
        "kernels/base.py get_cache_key), aten::mm tiled along dim 0 into tiles of 8192 down to 128 rows "
        "(python_ops/jax/config.py TilingConfig), and one per compiled graph; ops run on the CPU, views, copies "
        "and empty inputs compile none.",
        f"Compile time per NEFF: {COMPILE_SECONDS[0]:g}-{COMPILE_SECONDS[1]:g} s, from a third-party measurement of "
        "neuronx-cc on graphs of 8-323 nodes; AWS publishes no per-op figure. Large graphs can take minutes.",
        f"Launch cost: {EAGER_LAUNCH_SECONDS[0] * 1e6:g}-{EAGER_LAUNCH_SECONDS[1] * 1e6:g} µs per eager op launch "
        f"and {GRAPH_LAUNCH_SECONDS[0] * 1e6:g}-{GRAPH_LAUNCH_SECONDS[1] * 1e6:g} µs per compiled graph launch: no "
        "published figure, a range whose geometric middle the estimate takes (TorchNeuron's eager dispatch runs in "
        "Python; its Adaptive Eager Execution, which fuses queued ops, is not modelled).",
        "First run = NEFF compiles + a warm run; a warm run = the op calls' time (the roofline, at the calibrated "
        "peaks) + the launches, with the interval of the time model's out-of-sample error.",
    ]
