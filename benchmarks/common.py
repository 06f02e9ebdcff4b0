"""What the benchmark scripts share: the malloc settings they run under, the timing loop and the
interleaved rounds, child processes, the statistics of per-round values, and the Markdown table.

Every script sits beside this module (sys.path[0]) and starts with

    import common
    common.apply_malloc_env()  # before torch: may re-exec the script

Importing this module has no side effects and does not import torch, so `targets.py` can use it too.
"""
import argparse
import copy
import gc
import json
import math
import os
import platform
import statistics
import subprocess
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


def load_average():
    """The 1-minute load average: other busy processes make per-variant medians jumpy."""
    return os.getloadavg()[0]


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


def round_order(variants, r):
    """The order of the variants in round ``r``: rotated by r, and reversed every other cycle of
    len(variants) rounds, so each variant runs before and after each other one alike."""
    n = len(variants)
    order = list(variants[r % n:]) + list(variants[:r % n])
    return order if (r // n) % 2 == 0 else order[::-1]


def sample_size(per_call_s, budget_s, n_variants, chunk_s=CHUNK_S):
    """(calls per sample, rounds): samples of about ``chunk_s``, rounds of every variant filling
    ``budget_s``, at least 10."""
    inner = max(1, round(chunk_s / per_call_s))
    return inner, max(10, int(budget_s / (n_variants * inner * per_call_s)))


def interleaved_samples(fns: dict, budget_s: float, args: dict | None = None, chunk_s: float = CHUNK_S,
                        agree=None) -> tuple[dict, int, int]:
    """Time each callable of ``fns`` (called with ``args[variant]``, none by default) in samples of
    about ``chunk_s``, in rounds whose order rotates and then reverses (round_order), so drift hits
    every variant alike. ``agree(per_call_s)`` may replace the estimate of the slowest call (several
    processes must run the same number of calls). Returns (µs per call samples by variant, calls
    per sample, rounds)."""
    variants = list(fns)
    args = args or dict.fromkeys(variants, ())
    for v in variants:  # warm-up (allocator caches, lazy init, an optimizer's first step)
        time_loop(fns[v], args[v], 3)
    per_call = max(time_loop(fns[v], args[v], 3) for v in variants) / 1e6
    if agree is not None:
        per_call = agree(per_call)
    inner, rounds = sample_size(per_call, budget_s, len(variants), chunk_s)
    samples = {v: [] for v in variants}
    gc.collect()
    for r in range(rounds):
        for v in round_order(variants, r):
            samples[v].append(time_loop(fns[v], args[v], inner))
    return samples, inner, rounds


# ---------------------------------------------------------------- statistics of per-round values

def quartiles(values):
    """(q1, q3) of ``values`` (statistics.quantiles, its default 'exclusive' method)."""
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def median_ci(values, z=1.96):
    """The median and a distribution-free ~95% confidence interval (order statistics)."""
    s, n = sorted(values), len(values)
    half = z * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half))
    return statistics.median(s), s[lo], s[hi]


def median_ci_iqr(values):
    """The median of per-round values, its 95% CI (median_ci), their interquartile range, the rounds."""
    median, lo, hi = median_ci(values)
    q1, q3 = quartiles(values)
    return {"median": median, "ci95": [lo, hi], "iqr": [q1, q3], "rounds": len(values)}


def nearest_rank_percentiles(values):
    """The 10th, 25th, 75th and 90th percentiles of per-round values, each the sorted value at the
    nearest rank (no interpolation), and the rounds: how far one round strays from the median."""
    values = sorted(values)

    def at(q):
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]
    return {"p10": at(0.1), "p25": at(0.25), "p75": at(0.75), "p90": at(0.9), "rounds": len(values)}


def median_min_max(values, n=False):
    """The median and the extremes of ``values``; with ``n``, also their count."""
    result = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    if n:
        result["n"] = len(values)
    return result


# ---------------------------------------------------------------- child processes

def child_result(proc, mark: str, process_s: float, **identity) -> dict:
    """The JSON a benchmark's child process printed after ``mark`` (its last such line), with its
    wall time; or what went wrong."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith(mark)]
    if proc.returncode != 0 or not lines:
        return {**identity, "error": f"exit code {proc.returncode}", "stderr": proc.stderr[-4000:],
                "process_s": process_s}
    return {**json.loads(lines[-1][len(mark):]), "process_s": process_s}


def timed_out(e: subprocess.TimeoutExpired, timeout_s, **identity) -> dict:
    """What a child process that ran out of time leaves: the error, and the end of its stderr."""
    stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
    return {**identity, "error": f"timed out after {timeout_s} s", "stderr": stderr[-4000:]}


def run_process_tree(cmd, timeout_s, **popen) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s) for a command that starts
    processes of its own (torchrun, a benchmark's parts): on timeout the whole tree is killed, where
    subprocess.run kills only the direct child and its children run on."""
    import psutil  # accelerate's dependency

    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:  # listed before the kill: orphans are re-parented and out of reach
                tree = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                tree = []
            proc.kill()
            for child in tree:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout_s, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_child_process(cmd, env, mark: str, timeout_s, t0=None, **identity) -> dict:
    """Run ``cmd`` (a benchmark's own child process) and return child_result: the JSON it printed
    after ``mark`` with "process_s", its wall time, or the error (also when it runs out of time).
    ``t0``: the time.time() the child was told it starts at (in its command); by default the wall
    time is perf_counter's, from here."""
    start, clock = (time.perf_counter(), time.perf_counter) if t0 is None else (t0, time.time)
    try:
        proc = run_process_tree(cmd, timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        return timed_out(e, timeout_s, **identity)
    return child_result(proc, mark, clock() - start, **identity)


def log_child(label, result, summary):
    """A progress line on stderr for a child process: ``summary(result)``, or its error and the end of
    its stderr."""
    if "error" in result:
        print(f"  {label}: FAILED ({result['error']})\n{result['stderr']}", file=sys.stderr, flush=True)
    else:
        print(f"  {label}: {summary(result)}", file=sys.stderr, flush=True)


def backend_s(metrics):
    """Seconds in the neuron backend over the graphs of get_dynamo_metrics(): fx_passes + lower + compile."""
    return sum(m["fx_passes_us"] + m["lower_us"] + m["compile_us"] for m in metrics) / 1e6


# ---------------------------------------------------------------- report

def arguments(doc, threads=None, threads_help="intra-op threads (every variant)"):
    """The options every benchmark has: --json, and --threads defaulting to ``threads`` (the
    number of cores when None; False: no --threads)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers (every sample) here")
    if threads is not False:
        parser.add_argument("--threads", type=int, default=os.cpu_count() if threads is None else threads,
                            help=threads_help)
    return parser


def conditions(load, load_end=None, total_s=None, threads=None, thread_word="threads"):
    """The first words of a report: torch, threads, cores, the load average at the start (and the
    end), the total time."""
    import torch

    text = f"torch {torch.__version__}, "
    if threads is not None:
        text += f"{threads} {thread_word}, "
    text += f"{os.cpu_count()} cores ({platform.machine()}), load average {load:.1f} at start"
    if load_end is not None:
        text += f", {load_end:.1f} at the end"
    if total_s is not None:
        text += f"; total {total_s:.0f} s"
    return text


def markdown_table(headers, rows, align=""):
    """A Markdown table: the header row, the alignment row, then a line per row (a sequence of
    cells, each str()'d; an empty one stays empty). ``align`` holds a letter per column, "l" (the
    default for a column it does not reach) or "r"."""
    def line(cells):
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align.ljust(len(headers), "l")) + "|"
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def counts_text(items):
    """Each distinct item with its count, sorted: "hit ×2, miss ×1"."""
    return ", ".join(f"{c} ×{items.count(c)}" for c in sorted(set(items)))


def verdict(met):
    """A target's result cell."""
    return "PASS" if met else "MISS"


def write_json(path, data):
    """The --json file."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def report_outcome(misses, failures=(), failure_label="FAILED"):
    """The summary line every benchmark ends with, on stderr: targets missed, checks failed."""
    if misses:
        print(f"\nMISS: {', '.join(misses)}", file=sys.stderr)
    if failures:
        print(f"{failure_label}: {', '.join(failures)}", file=sys.stderr)
