"""What the benchmark scripts share: the malloc settings they run under, the timing loop and the
interleaved rounds, child processes, the summary line.

Every script sits beside this module (sys.path[0]) and starts with

    import common
    common.apply_malloc_env()  # before torch: may re-exec the script

Importing this module has no side effects and does not import torch.
"""
import copy
import gc
import json
import os
import sys
import time

# A fresh multi-MB malloc is an mmap with ms of page faults on these VMs, which
# would swamp the large-op timings: keep freed blocks in the heap (every variant
# benefits equally). glibc reads these only at startup, hence the re-exec.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}

CHUNK_S = 0.002  # each timed sample is a loop of about this long


def apply_malloc_env():
    """Re-exec this script with the missing MALLOC_ENV settings (a caller's own values stay); child
    processes inherit them. Call it before importing torch: the re-exec throws the process away."""
    if any(k not in os.environ for k in MALLOC_ENV):
        os.environ.update({k: v for k, v in MALLOC_ENV.items() if k not in os.environ})
        os.execv(sys.executable, [sys.executable, *sys.argv])


def to_neuron(a):
    """`a` on the neuron device: a module is copied first (the CPU one stays), a non-tensor stays."""
    import torch

    if isinstance(a, torch.nn.Module):
        return copy.deepcopy(a).to("neuron")
    return a.to("neuron") if isinstance(a, torch.Tensor) else a


def module_forward(module, x):
    """`module(x)` as a function of both, so the module can sit in a time_loop's args."""
    return module(x)


# ---------------------------------------------------------------- timing

def time_loop(fn, args, n):
    """µs per call of ``fn(*args)`` over ``n`` calls. Nothing else belongs inside the loop: a small
    op takes about a µs, so any extra step per call would show in every eager number."""
    start = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter_ns() - start) / n / 1e3  # µs per call


def interleaved_samples(fns: dict, budget_s: float) -> tuple[dict, int, int]:
    """Time each callable of ``fns`` in samples of about CHUNK_S, in rounds whose order rotates and
    then reverses, so drift hits every variant alike. Returns (µs per call samples by variant, calls
    per sample, rounds)."""
    variants = list(fns)
    for v in variants:  # warm-up (allocator caches, lazy init, an optimizer's first step)
        time_loop(fns[v], (), 3)
    per_call = max(time_loop(fns[v], (), 3) for v in variants) / 1e6
    inner = max(1, round(CHUNK_S / per_call))
    rounds = max(10, int(budget_s / (len(variants) * inner * per_call)))
    samples = {v: [] for v in variants}
    gc.collect()
    n = len(variants)
    for r in range(rounds):
        order = variants[r % n:] + variants[:r % n]
        for v in order if (r // n) % 2 == 0 else reversed(order):
            samples[v].append(time_loop(fns[v], (), inner))
    return samples, inner, rounds


# ---------------------------------------------------------------- child processes

def child_result(proc, mark: str, process_s: float, **identity) -> dict:
    """The JSON a benchmark's child process printed after ``mark`` (its last such line), with its
    wall time; or what went wrong."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith(mark)]
    if proc.returncode != 0 or not lines:
        return {**identity, "error": f"exit code {proc.returncode}", "stderr": proc.stderr[-4000:],
                "process_s": process_s}
    return {**json.loads(lines[-1][len(mark):]), "process_s": process_s}


# ---------------------------------------------------------------- report

def report_outcome(misses, failures=(), failure_label="FAILED"):
    """The summary line every benchmark ends with, on stderr: targets missed, checks failed."""
    if misses:
        print(f"\nMISS: {', '.join(misses)}", file=sys.stderr)
    if failures:
        print(f"{failure_label}: {', '.join(failures)}", file=sys.stderr)
