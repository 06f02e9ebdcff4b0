"""The cost of op tracking on neuron, per level, against plain CPU PyTorch.

``torch.ops.neuron._set_op_tracking_level``: 0 = off, 1 = count each op call in the core (the
default), 2 = also hand each call to the Python observer (diagnostics collecting, through
``torch_neuronx.diagnostics.start()`` / ``stop()``). Every case runs the same call on CPU tensors
and on neuron tensors at each level in this one process, interleaved round by round (the order
rotating and reversing), so machine noise and frequency drift hit every variant alike. Reported:
the median time per call of each variant, the medians of the per-round paired ratio to CPU, and
the median of the per-round paired difference to level 0 with its 95% confidence interval
(distribution-free, from the order statistics). Targets: level 1 adds < 0.15 µs per op over
level 0, judged on the small op, whose noise can resolve it; observing (level 2) adds <= 5 µs per
small op over the default (level 1: the per-round paired difference), and an MLP forward observed
takes <= 1.10x its unobserved time (the per-round paired ratio). Both are printed with their 95% CI
and the interquartile range of the per-round values, and kept in the JSON under
``observing.small_op_us`` and ``observing.mlp_ratio``.

    python benchmarks/bench_diagnostics.py [--json PATH] [--threads N] [--scale X]
"""
import gc
import os
import statistics
import sys
import time

import common  # beside this script (sys.path[0])

# First: re-exec this script when the MALLOC_* settings are missing.
common.apply_malloc_env()

from common import time_loop  # noqa: E402
from targets import target as target_entry  # noqa: E402

import torch  # noqa: E402  (autoloads the neuron backend)
import torch.nn.functional as F  # noqa: E402

import torch_neuronx  # noqa: E402
from torch_neuronx import diagnostics  # noqa: E402

LEVEL_TARGET_US = 0.15  # level 1 over level 0, per op
OBSERVING_TARGET_US = 5.0  # level 2 over level 1, per small op
OBSERVING_TARGET_RATIO = 1.10  # an MLP forward at level 2 over level 1
SMALL_OP, MLP_CASE = "add 1000 elements", "MLP 4x(Linear(256,256)+GELU), batch 32"
LABELS = {"cpu": "CPU", "l0": "neuron level 0 (off)", "l1": "neuron level 1 (count, default)",
          "l2": "neuron level 2 (diagnostics)"}


class MLP(torch.nn.Module):
    """``layers`` x (Linear(d, d) + GELU)."""

    def __init__(self, d=256, layers=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = F.gelu(layer(x))
        return x


def set_level(variant):
    """Put the process in ``variant``'s tracking level (CPU: level 1, the default; it does not matter).
    Level 2 is diagnostics.start(); once collecting, the collector stays (as in a program that starts
    it once) and the variants only switch the level, so level 2 measures steady-state collection,
    not a fresh collector's first signatures."""
    if variant == "l2" and diagnostics.observer.active() is None:
        diagnostics.start()
    torch.ops.neuron._set_op_tracking_level({"l0": 0, "l2": 2}.get(variant, 1))


def measure(name, fn, args_by_side, variants, budget_s, target=None):
    """Interleaved rounds of every variant (common.round_order), each sample a loop of about
    common.CHUNK_S: unlike common.interleaved_samples, the calls per sample are sized for each
    variant on its own, and each sample first switches the tracking level."""
    inner = {}
    for v in variants:  # warm up (allocator caches, lazy init, the observer's first signature)
        args = args_by_side["cpu" if v == "cpu" else "neuron"]
        set_level(v)
        time_loop(fn, args, 3)
        per_call = time_loop(fn, args, 5) / 1e6
        inner[v] = max(1, round(common.CHUNK_S / per_call))
    round_s = len(variants) * common.CHUNK_S
    rounds = max(10, int(budget_s / round_s))
    samples = {v: [] for v in variants}
    try:
        for r in range(rounds):
            for v in common.round_order(variants, r):
                set_level(v)
                samples[v].append(time_loop(fn, args_by_side["cpu" if v == "cpu" else "neuron"], inner[v]))
    finally:
        diagnostics.stop()
        diagnostics.observer.clear()  # what level 2 collected: not needed
        torch.ops.neuron._set_op_tracking_level(1)  # the default again
    cpu = samples["cpu"]
    result = {"name": name, "rounds": rounds, "inner": inner, "target": target, "samples": samples,
              "us": {v: statistics.median(samples[v]) for v in variants},
              "ratio": {v: statistics.median(x / c for c, x in zip(cpu, samples[v])) for v in variants if v != "cpu"}}
    if "l0" in variants:
        result["over_l0_us"] = {v: common.median_ci([x - z for z, x in zip(samples["l0"], samples[v])])
                                for v in variants if v not in ("cpu", "l0")}
    if target:
        result["pass"] = result["over_l0_us"]["l1"][0] < target
    if "l2" in variants:  # observing against the default: paired per round
        result["l2_over_l1_us"] = [x - d for d, x in zip(samples["l1"], samples["l2"])]
        result["l2_over_l1_ratio"] = [x / d for d, x in zip(samples["l1"], samples["l2"])]
    return result


def spread(values, target):
    """The median of per-round values, its 95% CI, their interquartile range, the target and whether it is met."""
    summary = common.median_ci_iqr(values)
    return {**summary, "target": target, "pass": summary["median"] <= target}


def observing_summary(results):
    """What observing costs (level 2 over the default level 1): per small op in µs, and the MLP ratio."""
    by_name = {r["name"]: r for r in results}
    return {"small_op_us": spread(by_name[SMALL_OP]["l2_over_l1_us"], OBSERVING_TARGET_US),
            "mlp_ratio": spread(by_name[MLP_CASE]["l2_over_l1_ratio"], OBSERVING_TARGET_RATIO)}


def observing_lines(summary):
    small, mlp = summary["small_op_us"], summary["mlp_ratio"]
    verdict = lambda s: common.verdict(s["pass"])  # noqa: E731
    return [
        f"Observing (level 2) over the default (level 1), per-round pairs: {SMALL_OP}: "
        f"{small['median']:+.2f} µs per op [95% CI {small['ci95'][0]:+.2f}, {small['ci95'][1]:+.2f}; "
        f"IQR {small['iqr'][0]:+.2f}, {small['iqr'][1]:+.2f}; {small['rounds']} rounds] "
        f"(target <= +{small['target']:g} µs: {verdict(small)})",
        f"{MLP_CASE}: {mlp['median']:.3f}x [95% CI {mlp['ci95'][0]:.3f}, {mlp['ci95'][1]:.3f}; "
        f"IQR {mlp['iqr'][0]:.3f}, {mlp['iqr'][1]:.3f}; {mlp['rounds']} rounds] "
        f"(target <= {mlp['target']:.2f}x: {verdict(mlp)})",
    ]


def check_levels():
    """What each level does, checked once: 0 counts nothing, 1 counts, 2 counts and observes."""
    x = torch.rand(1000, device="neuron")
    failures = []
    for variant, counts, observes in (("l0", False, False), ("l1", True, False), ("l2", True, True)):
        diagnostics.stop()
        torch_neuronx.clear_op_tracking()
        set_level(variant)
        torch.add(x, x)
        collector = diagnostics.observer.active()
        observed = collector is not None and any(key[0] == "aten::add.Tensor" for key in collector.phase.calls)
        diagnostics.stop()
        counted = "aten::add.Tensor" in torch_neuronx.get_executed_ops()
        if counted != counts or observed != observes:
            failures.append(f"level {variant[1]}: counted {counted}, observed {observed}")
    torch_neuronx.clear_op_tracking()
    torch.ops.neuron._set_op_tracking_level(1)
    return failures


def build_cases(scale):
    torch.manual_seed(0)
    add_args = (torch.rand(1000), torch.rand(1000))
    mm_args = (torch.randn(256, 256), torch.randn(256, 256))
    mlp, x = MLP().eval(), torch.randn(32, 256)
    ops = ("cpu", "l0", "l1", "l2")
    return [
        (SMALL_OP, torch.add, add_args, ops, 30 * scale, LEVEL_TARGET_US),
        ("matmul 256x256", torch.mm, mm_args, ops, 20 * scale, None),
        (MLP_CASE, common.module_forward, (mlp, x), ("cpu", "l1", "l2"),
         15 * scale, None),
    ]


def fmt_ci(m, lo, hi):
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def markdown(results, threads, load, load_end, total_s):
    rows = []
    for r in results:
        for v, us in r["us"].items():
            ratio = "—" if v == "cpu" else f"{r['ratio'][v]:.3f}x"
            over = fmt_ci(*r["over_l0_us"][v]) if v in r.get("over_l0_us", {}) else "—"
            target = result = "—"
            if r["target"] and v == "l1":
                target, result = f"< +{r['target']:g} µs", common.verdict(r["pass"])
            rows.append([r["name"], LABELS[v], r["rounds"], f"{us:.2f}", ratio, over, target, result])
    return "\n".join([
        f"{common.conditions(load, load_end, total_s, threads, 'thread(s)')}. Median µs per call; "
        "ratio and +µs are medians of interleaved per-round pairs; [95% CI] of the median difference.",
        "",
        common.markdown_table(["case", "variant", "rounds", "µs per call", "ratio vs CPU", "+µs vs level 0 [95% CI]",
                               "target", "result"], rows, align="llrrrlll"),
    ])


def main():
    parser = common.arguments(__doc__, threads=1)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every case's time budget")
    opts = parser.parse_args()

    load = common.load_average()
    start = time.perf_counter()
    torch.set_num_threads(opts.threads)  # one process, so every variant shares the setting
    failures = check_levels()
    gc.collect()
    gc.disable()  # a collection landing inside one variant's loop is noise
    results = []
    with torch.no_grad():
        for name, fn, cpu_args, variants, budget, target in build_cases(opts.scale):
            args = {"cpu": cpu_args, "neuron": tuple(common.to_neuron(a) for a in cpu_args)}
            results.append(measure(name, fn, args, list(variants), budget, target))
            r = results[-1]
            print(f"  {name}: " + " / ".join(f"{r['us'][v]:.2f}" for v in variants) + " µs ("
                  + ", ".join(variants) + ")", file=sys.stderr, flush=True)
    gc.enable()
    load_end, total_s = common.load_average(), time.perf_counter() - start
    print(markdown(results, opts.threads, load, load_end, total_s))
    observing = observing_summary(results)
    print("\n" + "\n".join(observing_lines(observing)))
    if opts.json:
        meta = {"torch": torch.__version__, "threads": opts.threads, "cores": os.cpu_count(), "loadavg": load,
                "loadavg_end": load_end, "total_s": total_s, "malloc_env": common.MALLOC_ENV}
        by_name = {r["name"]: r for r in results}
        targets = [
            target_entry("observing: small op (+µs over not observing)", by_name[SMALL_OP]["l2_over_l1_us"],
                         OBSERVING_TARGET_US, unit="µs"),
            target_entry("observing: MLP forward (observed/not observed)", by_name[MLP_CASE]["l2_over_l1_ratio"],
                         OBSERVING_TARGET_RATIO)]
        common.write_json(opts.json, {"meta": meta, "targets": targets, "observing": observing, "results": results})
    misses = [f"{r['name']} (level 1 over level 0)" for r in results if r.get("pass") is False]
    misses += [f"observing {name}" for name, s in observing.items() if not s["pass"]]
    common.report_outcome(misses, failures)


if __name__ == "__main__":
    main()
