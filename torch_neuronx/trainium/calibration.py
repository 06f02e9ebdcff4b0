"""AWS's published end-to-end figures (:data:`ROWS`), each with the conditions it was measured in,
and the program run (:data:`RUNS`) whose plan predicts it: what the time model's unpublished
constants (:data:`torch_neuronx.trainium.time_model.CALIBRATION`) are fitted to and validated on
(leave one out: :mod:`.fit`).

Every row is copied as published from aws-neuron/aws-neuron-sdk (the source of
awsdocs-neuron.readthedocs-hosted.com), or the vLLM Neuron plugin's docs for one; ``source`` names
the file (and the commit, where the row has left the current page). A row is read off its run's
plan: a TPOT off the "decode" step, a TTFT off the "prefill" step (the whole prefill), a training
throughput off the "train" step (the global batch over its seconds). The programs are in
``tests/programs/simulate/``: one Llama decoder for every inference row (``llama_decode_tp.py``,
sharded as NxD Inference and Transformers NeuronX shard it) and one Megatron-style training step
(``llama_train_tp_dp.py``). Benchmarks run them at full size; the suite runs them at one and two
layers (and microbatches) and extrapolates the records (:func:`extrapolate`).
"""
from __future__ import annotations

import dataclasses

LLAMA_70B = [  # Llama-3-70B, 3.1-70B and 3.3-70B share this shape
   "--layers", "80", "--hidden", "8192", "--ffn", "28672", "--heads", "64", "--kv-heads", "8",
                "--vocab", "128256"]
LLAMA_31_405B = ["--layers", "126", "--hidden", "16384", "--ffn", "53248", "--heads", "128", "--kv-heads", "8",
                 "--vocab", "128256"]
LLAMA_2_7B = ["--layers", "32", "--hidden", "4096", "--ffn", "11008", "--heads", "32", "--kv-heads", "32",
              "--vocab", "32000"]
TRN2_TP64 = ["--nproc-per-node", "64", "--instance", "trn2.48xlarge"]
TRN1_TP32 = ["--nproc-per-node", "32", "--instance", "trn1.32xlarge", "--lnc", "1"]
NXDI = "NxD Inference served by vLLM; LLMPerf with Neuron's patch (TPOT excludes the first token), 50 requests"
TNX = "Transformers NeuronX, SDK 2.18 (in-process sampling; FP16 model, BF16 matmuls, weights stored BF16)"
NXDT = "NxD Training (Megatron TP with sequence parallelism, selective activation checkpointing, ZeRO-1)"
SDK = "aws-neuron-sdk "


@dataclasses.dataclass(frozen=True)
class Run:
    """A program and its simulator command line, at full size: (simulator flags, program, its flags)."""

    simulator: tuple
    program: str
    flags: tuple
    kind: str  # "decode" (its prefill and decode steps) or "train"
    layers: int  # full depth, for the suite's extrapolation from 1 and 2 layers
    microbatches: int = 1  # per DP rank and optimizer step, for the training runs' extrapolation
    dp: int = 1  # data-parallel ranks of a training run (its global batch is dp x microbatches)


@dataclasses.dataclass(frozen=True)
class Row:
    """One published figure and everything it was measured under."""

    name: str  # model and metric, as published
    value: float
    unit: str  # "s" (per token or per prefill) or "sequences/s"
    step: str  # the plan's marked step it is read from
    run: str  # the key of its program run (RUNS)
    instance: str  # instances x count, LNC
    parallelism: str
    batch: str
    lengths: str  # input / output tokens, the buckets the stack compiled, or the sequence
    dtype: str
    stack: str
    measured: str  # how the figure was taken: statistic, client or in-process
    source: str


def _decode(model: list, simulator: list, *flags: str) -> Run:
    return Run(tuple(simulator), "llama_decode_tp.py", (*model, *flags, "--new-tokens", "4"), "decode",
               int(model[model.index("--layers") + 1]))


RUNS = {
    "70b-trn2": _decode(LLAMA_70B, TRN2_TP64, "--prompt", "12288", "--max-length", "12800"),
    "405b-trn2": _decode(LLAMA_31_405B, TRN2_TP64, "--prompt", "10240", "--max-length", "12800"),
    "70b-trn1": _decode(LLAMA_70B, TRN1_TP32, "--prompt", "128", "--max-length", "1152", "--dtype", "float16"),
    "70b-trn1-b4": _decode(LLAMA_70B, TRN1_TP32, "--batch", "4", "--prompt", "128", "--max-length", "1152",
                           "--dtype", "float16"),
    "70b-trn1-2048": _decode(LLAMA_70B, TRN1_TP32, "--prompt", "2048", "--max-length", "4096", "--dtype",
                             "float16"),
    "7b-trn1": _decode(LLAMA_2_7B, TRN1_TP32, "--prompt", "128", "--max-length", "8192", "--dtype", "float16"),
    "7b-trn1-b8": _decode(LLAMA_2_7B, TRN1_TP32, "--batch", "8", "--prompt", "128", "--max-length", "8192",
                          "--dtype", "float16"),
    "8b-train": Run(("--nproc-per-node", "32", "--nnodes", "32", "--instance", "trn1.32xlarge", "--lnc", "1"),
                    "llama_train_tp_dp.py", ("--sequence-parallel",), "train", 32, 32, dp=32),
    "7b-train": Run(("--nproc-per-node", "32", "--nnodes", "16", "--instance", "trn1.32xlarge", "--lnc", "1"),
                    "llama_train_tp_dp.py", (*LLAMA_2_7B, "--seq", "4096", "--tp", "8", "--sequence-parallel"),
                    "train", 32, 16, dp=64),
}

NXDI_70B = SDK + "libraries/nxd-inference/tutorials/llama70b_perf_comparison.csv (no speculative decoding); " \
    "conditions: trn2-llama3.3-70b-tutorial.rst"
NXDI_405B = SDK + "libraries/nxd-inference/tutorials/llama405b_perf_comparison.csv; conditions and the LLMPerf " \
    "output: trn2-llama3.1-405b-speculative-tutorial.rst, scenario 1 (commit ba1c08b0)"
TNX_LATENCY = SDK + "about-neuron/benchmarks/trn1/latency_data_decoder.csv (run mode Real Time)"
TNX_BATCH = SDK + "about-neuron/benchmarks/trn1/throughput_data_decoder.csv (run mode Batch)"
TRN2_ONE = "1 x trn2.48xlarge, LNC=2 (64 logical cores)"
TRN1_ONE = "1 x trn1.32xlarge (32 NeuronCore-v2)"
NXDI_KERNELS = NXDI + "; fused QKV, NKI QKV, attention and MLP kernels, on-device sampling"
P50_SERVED = "P50 over 50 requests at concurrency 1, client side (streaming through vLLM's OpenAI server)"
P50_TNX = "P50 (how many runs and what warm-up: not published)"
TRAIN_THROUGHPUT = "sequences/s at the global batch, strong scaling (NxD's moving average over 10 steps)"


def _nxdi(name, value, step, run, source, lengths):
    return Row(name, value, "s", step, run, TRN2_ONE, "TP=64 (context encoding sequence parallel)",
               "1 (max-num-seqs 1)", lengths, "BF16", NXDI_KERNELS, P50_SERVED, source)


def _tnx(name, value, step, run, source, batch, lengths):
    return Row(name, value, "s", step, run, TRN1_ONE, "TP=32 (KV heads replicated to the TP degree)", batch,
               lengths, "FP16 model, BF16 matmuls, BF16 weights", TNX, P50_TNX, source)


NXDI_70B_LENGTHS = ("10,000 in (context-encoding bucket 12,288) / 1,500 out (1,501 generated; token-generation "
                    "bucket 12,800)")
NXDI_405B_LENGTHS = ("10,000 in (context-encoding bucket 10,240) / 1,500 asked, 1,785 generated (P50; "
                     "token-generation bucket 12,800)")
ROWS = {
    "70b-trn2-tpot": _nxdi("Llama-3.3-70B-Instruct TPOT", 19.6e-3, "decode", "70b-trn2", NXDI_70B, NXDI_70B_LENGTHS),
    "70b-trn2-ttft": _nxdi("Llama-3.3-70B-Instruct TTFT", 814.2e-3, "prefill", "70b-trn2", NXDI_70B,
                           NXDI_70B_LENGTHS),
    "405b-trn2-tpot": _nxdi("Llama-3.1-405B-Instruct TPOT", 37.9e-3, "decode", "405b-trn2", NXDI_405B,
                            NXDI_405B_LENGTHS),
    "405b-trn2-ttft": _nxdi("Llama-3.1-405B-Instruct TTFT", 2442e-3, "prefill", "405b-trn2", NXDI_405B,
                            NXDI_405B_LENGTHS),
    "70b-trn1-tpot": _tnx("Llama-3-70B TPOT", 24.48e-3, "decode", "70b-trn1", TNX_LATENCY, "1",
                          "128 in / 1,024 out (sequence 1,152)"),
    "70b-trn1-b4-tpot": _tnx("Llama-3-70B TPOT, batch 4", 28.38e-3, "decode", "70b-trn1-b4", TNX_BATCH, "4",
                             "128 in / 1,024 out (sequence 1,152)"),
    "70b-trn1-ttft": _tnx("Llama-3-70B TTFT", 547e-3, "prefill", "70b-trn1-2048", TNX_LATENCY, "1",
                          "2,048 in / 2,048 out (sequence 4,096)"),
    "7b-trn1-tpot": _tnx("Llama-2-7b TPOT", 6.69956207e-3, "decode", "7b-trn1", TNX_LATENCY, "1",
                         "128 in / 8,064 out (sequence 8,192)"),
    "7b-trn1-b8-tpot": _tnx("Llama-2-7b TPOT, batch 8", 10.09511948e-3, "decode", "7b-trn1-b8", TNX_BATCH, "8",
                            "128 in / 8,064 out (sequence 8,192)"),
    "8b-train": Row("Llama-3.1-8B pre-training", 47.95, "sequences/s", "train", "8b-train",
                    "32 x trn1.32xlarge (1,024 NeuronCore-v2)", "TP=32 DP=32 PP=1, ZeRO-1",
                    "global 1,024 (microbatch 1: 32 per DP rank)", "sequence 8,192",
                    "BF16 autocast, FP32 optimizer (AdamW)", NXDT + ", SDK 2.24.0", TRAIN_THROUGHPUT,
                    SDK + "about-neuron/benchmarks/trn1/training_data_decoder.csv"),
    "7b-train": Row("Llama2-7B pre-training", 95.14, "sequences/s", "train", "7b-train",
                    "16 x trn1.32xlarge (512 NeuronCore-v2)", "TP=8 DP=64, ZeRO-1",
                    "global 1,024 (microbatch 1: 16 per DP rank)", "sequence 4,096",
                    "BF16 autocast, FP32 optimizer (AdamW)", NXDT + ", SDK 2.21.0", TRAIN_THROUGHPUT,
                    SDK + "general/benchmarks/trn1/training_data_decoder.csv (commit 752349fd; off the page since "
                    "2025-04-03)"),
}
GLOBAL_BATCH = 1024  # the training rows' sequences per step


def label(row: Row) -> str:
    """A row in one line, as time_model.CALIBRATION.fitted_to names it."""
    value = f"{row.value * 1e3:g} ms" if row.unit == "s" else f"{row.value:g} sequences/s"
    return f"{row.name} {value}, {row.instance.split(' (')[0].split(',')[0]}, {row.parallelism.split(' (')[0]}"


def value(row: Row, step_seconds: float) -> float:
    """The row's quantity from its step's seconds: a decode step is one token, a prefill the first
    token, a training step the global batch of sequences."""
    return GLOBAL_BATCH / step_seconds if row.unit == "sequences/s" else step_seconds


def ratio(row: Row, predicted: float) -> float:
    """How much slower the prediction is than the row (above 1: slower, below: faster)."""
    return row.value / predicted if row.unit == "sequences/s" else predicted / row.value
