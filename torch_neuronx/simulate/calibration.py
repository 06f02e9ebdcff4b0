"""AWS's published end-to-end figures, what a plan predicts for each, and the fit of the time model's
unpublished constants to them (:data:`torch_neuronx.diagnostics.time_model.CALIBRATION`).

Each figure is read off the plan of a program of its shape (``tests/programs/simulate/``:
``llama_decode_tp.py`` and ``llama_train_tp_dp.py --sequence-parallel``) at the no-overlap end of
the step's range. The benchmark runs them at full size; the suite at one and two layers (and one
and two microbatches), extrapolated linearly: every layer and microbatch costs the same.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from torch_neuronx.diagnostics import time_model


@dataclasses.dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str  # "s" per token or step, or "sequences/s"
    step: str  # the marked step it is read from
    stack: str  # what AWS measured
    source: str


FIGURES = {
    "tpot": Figure("Llama-3.3-70B TPOT P50, trn2.48xlarge TP=64 LNC=2, batch 1, 10,000 in / 1,500 out, BF16",
                   19.6e-3, "s", "decode", "NxD Inference (compiled whole, NKI kernels)",
                   "aws-neuron-sdk libraries/nxd-inference/tutorials/llama70b_perf_comparison.csv"),
    "ttft": Figure("Llama-3.3-70B TTFT P50, same run", 814.2e-3, "s", "prefill", "NxD Inference",
                   "aws-neuron-sdk libraries/nxd-inference/tutorials/llama70b_perf_comparison.csv"),
    "train": Figure("Llama-3.1-8B pre-training, 32 x trn1.32xlarge TP=32 DP=32, seq 8192, global batch 1024, "
                    "BF16, FP32 optimizer, ZeRO-1", 47.95, "sequences/s", "train",
                    "NxD Training (sequence parallel, selective activation checkpointing)",
                    "aws-neuron-sdk about-neuron/benchmarks/trn1/training_data_decoder.csv"),
}
# The simulator's command line for each program at full size (the program's own flags after it).
RUNS = {
    "decode": (["--nproc-per-node", "64", "--instance", "trn2.48xlarge"], "llama_decode_tp.py",
               ["--max-length", "11500"]),  # the cache of AWS's 10,000 + 1,500 tokens
    "train": (["--nproc-per-node", "32", "--nnodes", "32", "--instance", "trn1.32xlarge", "--lnc", "1"],
              "llama_train_tp_dp.py", ["--sequence-parallel"]),
}
FIGURES_OF = {"decode": ("tpot", "ttft"), "train": ("train",)}
GLOBAL_BATCH = 1024  # the training figure's sequences per step


def step_seconds(figure: Figure, steps: dict, end: int = 1) -> float:
    """The seconds of one step ``figure`` is read from (plan["time"]["steps"]); ``end`` 1 is the
    no-overlap end of the range, 0 the full-overlap end."""
    return steps[figure.step]["seconds"][end]


def value(figure: Figure, seconds: float) -> float:
    """The figure's quantity from its step's seconds: a decode step is one token, a training step
    the benchmark's global batch of sequences."""
    return GLOBAL_BATCH / seconds if figure.unit == "sequences/s" else seconds


def ratio(figure: Figure, value: float) -> float:
    """How much slower the prediction is than the figure (above 1: slower, below: faster)."""
    return figure.value / value if figure.unit == "sequences/s" else value / figure.value


def extrapolate(values: dict, layers: int, microbatches: int = 1) -> float:
    """A value at (``layers``, ``microbatches``) from its values at (1 or 2 layers) x (1 or 2
    microbatches), {(l, m): v}, bilinear: a fixed part, a part per layer, per microbatch and per both."""
    if (1, 2) not in values:
        return values[1, 1] + (layers - 1) * (values[2, 1] - values[1, 1])
    a, b, c, d = values[1, 1], values[2, 1], values[1, 2], values[2, 2]
    per_both = d - b - c + a
    return a + (layers - 1) * (b - a) + (microbatches - 1) * (c - a) + (layers - 1) * (microbatches - 1) * per_both


def fit(predict, grid=None) -> tuple[time_model.Calibration, dict]:
    """The calibration on ``grid`` (compute fractions, bandwidth fractions, NeuronLink step latencies)
    minimizing the largest |log ratio| over the figures; ``predict(cal)`` -> {figure key: value}."""
    grid = grid or ([0.4, 0.45, 0.5, 0.55, 0.6], [0.35, 0.4, 0.45, 0.5, 0.55], [0.45e-6, 0.5e-6, 0.55e-6, 0.6e-6])
    base, best = time_model.CALIBRATION, None
    for compute, bandwidth, latency in itertools.product(*grid):
        cal = dataclasses.replace(base, compute_fraction=compute, bandwidth_fraction=bandwidth,
                                  step_latency_s={**base.step_latency_s, time_model.NEURONLINK: latency})
        ratios = {key: ratio(FIGURES[key], value) for key, value in predict(cal).items()}
        score = max(abs(math.log(r)) for r in ratios.values())
        if best is None or score < best[0]:
            best = (score, cal, ratios)
    return best[1], best[2]
