"""Compiled mode of the neuron device: ``torch.compile(backend="neuron")`` against Inductor on CPU.

Run time: a small transformer's forward and an MLP training step, each as CPU eager, neuron
eager, Inductor CPU and compiled neuron, in this one process, interleaved round by round (the
order rotating), so machine noise and frequency drift hit every variant alike. Reported: the
median time per call of each, and the median of the per-round ratio compiled neuron / Inductor
CPU. Compiled neuron runs the code Inductor generates for CPU, so its results must equal
Inductor CPU's bit for bit; that is checked once per case.

Compile time, each in a fresh process: the neuron backend cold and then warm on one compile
cache directory, and diffusers' regional compilation (``compile_repeated_blocks``) against
compiling the whole model, each on its own empty cache. Warm starts come in two kinds, run in
alternation: with the compiled graphs in the cache (Dynamo traces the code again), and with
Dynamo's caching precompile on (``TORCH_CACHING_PRECOMPILE=1``: the whole compiled function is in
the cache, nothing is traced). Each round has its own cold process and cache directory; the warm /
cold ratio of the start (compile + first result) is reported per round, as median, min and max,
under ``compile.warm_start`` in the JSON. Beside it, the floor: a fresh process importing only
Dynamo and the modules Inductor's generated code imports, which any start that runs the graph pays.

    python benchmarks/bench_compile.py [--json PATH] [--threads N] [--only train|forward]
                                       [--compile-rounds N] [--compile-only]

In the --json file, ``ratios.<key>`` holds each run-time case's ratio and its spread over rounds
(keys: ``transformer_fwd``, ``mlp_train_step``); ``--only`` runs one run-time case and skips the
compile-time cases; ``--compile-only`` runs only the compile-time cases.
"""
import argparse
import copy
import gc
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import common  # beside this script (sys.path[0])

# First: re-exec this script when the MALLOC_* settings are missing; child processes inherit them.
common.apply_malloc_env()

import bench_eager  # noqa: E402  (its PreLNBlock)
from targets import target as target_entry  # noqa: E402

import torch  # noqa: E402  (autoloads the neuron backend)
import torch.nn.functional as F  # noqa: E402

from torch_neuronx import neuron_dynamo_backend  # noqa: E402

VARIANTS = ("cpu_eager", "neuron_eager", "inductor_cpu", "neuron_compiled")
COMPILE_KW = {"fullgraph": True, "dynamic": False}
CHILD_MARK = "BENCH_COMPILE_RESULT "
CHILD_TIMEOUT_S = 300


class SmallTransformer(torch.nn.Module):
    """`n_blocks` pre-LN blocks (bench_eager's: SDPA attention, MLP 4x) and a final LayerNorm."""

    def __init__(self, n_blocks=4, d_model=256, nhead=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(bench_eager.PreLNBlock(d_model, nhead) for _ in range(n_blocks))
        self.ln_f = torch.nn.LayerNorm(d_model)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


class MLPLoss(torch.nn.Module):
    """Three Linear layers, `width` wide, and the MSE loss: the compiled part of a training step."""

    def __init__(self, width=512):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x, y):
        return F.mse_loss(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))), y)


def transformer_input():
    return torch.randn(4, 128, 256, generator=torch.Generator().manual_seed(1))


def compile_neuron(module):
    return torch.compile(module, backend="neuron", **COMPILE_KW)


# ---------------------------------------------------------------- run time, in this process

def forward_variants():
    """Zero-argument callables, one per variant, each returning the output."""
    torch.manual_seed(0)
    model = SmallTransformer().eval()
    x = transformer_input()
    neuron_model, xn = common.to_neuron(model), x.to("neuron")
    inductor = torch.compile(copy.deepcopy(model), backend="inductor", **COMPILE_KW)
    compiled = compile_neuron(copy.deepcopy(neuron_model))
    return {
        "cpu_eager": lambda: model(x),
        "neuron_eager": lambda: neuron_model(xn),
        "inductor_cpu": lambda: inductor(x),
        "neuron_compiled": lambda: compiled(xn),
    }


def training_variants():
    """One training step per call: zero_grad, compiled (or eager) forward+loss, backward, AdamW step.
    Every variant starts from the same weights; AdamW is eager everywhere, foreach on both devices
    (its default on neuron; CPU would otherwise take the per-tensor loop)."""
    torch.manual_seed(0)
    base = MLPLoss()
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, 512, generator=gen), torch.randn(64, 512, generator=gen)

    def step_fn(device, compile_with):
        module = copy.deepcopy(base).to(device)
        model = module if compile_with is None else torch.compile(module, backend=compile_with, **COMPILE_KW)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4, foreach=True)
        xd, yd = x.to(device), y.to(device)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = model(xd, yd)
            loss.backward()
            opt.step()
            return loss.detach(), module

        return step

    return {
        "cpu_eager": step_fn("cpu", None),
        "neuron_eager": step_fn("neuron", None),
        "inductor_cpu": step_fn("cpu", "inductor"),
        "neuron_compiled": step_fn("neuron", "neuron"),
    }


def _as_cpu(t):
    return t.detach().to("cpu")


def compare(reference, candidate):
    """(equal, max abs difference) of two tensors, or of losses, grads and weights after one step."""
    if isinstance(reference, torch.Tensor):
        pairs = [(reference, candidate)]
    else:  # (loss, module) of a training step: the grads are still set until the next zero_grad
        (loss_a, mod_a), (loss_b, mod_b) = reference, candidate
        pairs = [(loss_a, loss_b)]
        for (_, pa), (_, pb) in zip(mod_a.named_parameters(), mod_b.named_parameters()):
            pairs += [(pa.grad, pb.grad), (pa, pb)]
    equal, diff = True, 0.0
    for a, b in pairs:
        a, b = _as_cpu(a), _as_cpu(b)
        equal &= torch.equal(a, b)
        diff = max(diff, (a.double() - b.double()).abs().max().item())
    return equal, diff


def measure(key, name, variants, budget_s, target):
    first_call_s, outputs = {}, {}
    for v in VARIANTS:  # first call: compiles the compiled variants
        start = time.perf_counter()
        outputs[v] = variants[v]()
        first_call_s[v] = time.perf_counter() - start
    equal, diff = compare(outputs["inductor_cpu"], outputs["neuron_compiled"])
    _, diff_eager = compare(outputs["cpu_eager"], outputs["neuron_compiled"])
    del outputs
    print(f"  {name}: compiled (first call) in {first_call_s['inductor_cpu']:.1f} s (Inductor CPU), "
          f"{first_call_s['neuron_compiled']:.1f} s (neuron)", file=sys.stderr, flush=True)

    samples, inner, rounds = common.interleaved_samples(
        {v: (lambda f=variants[v]: f()) for v in VARIANTS}, budget_s)
    ratios = sorted(n / i for i, n in zip(samples["inductor_cpu"], samples["neuron_compiled"]))
    result = {
        "key": key,
        "name": name,
        "inner": inner,
        "rounds": rounds,
        **{f"{v}_us": statistics.median(samples[v]) for v in VARIANTS},
        "ratio": statistics.median(ratios),
        "ratio_spread": common.nearest_rank_percentiles(ratios),
        "ratio_rounds": ratios,
        "eager_ratio": statistics.median(n / c for c, n in zip(samples["cpu_eager"], samples["neuron_eager"])),
        "first_call_s": first_call_s,
        "equal_to_inductor": equal,
        "max_abs_diff_vs_inductor": diff,
        "max_abs_diff_vs_cpu_eager": diff_eager,
        "target": target,
        "samples": samples,
    }
    result["pass"] = result["ratio"] <= target
    print(f"  {name}: " + " / ".join(f"{result[v + '_us']:.1f}" for v in VARIANTS) + " µs, ratio "
          f"{result['ratio']:.3f} ({_spread_text(result['ratio_spread'])})", file=sys.stderr, flush=True)
    return result


# ---------------------------------------------------------------- compile time, in child processes

def _child_transformer():
    torch.manual_seed(0)
    return SmallTransformer().eval()


def _child_repeated_model():
    from diffusers.models.modeling_utils import ModelMixin

    class RepeatedBlocksModel(ModelMixin):
        """Six identical blocks; diffusers compiles each class named in _repeated_blocks once."""
        _repeated_blocks = ["PreLNBlock"]

        def __init__(self):
            super().__init__()
            self.body = SmallTransformer(n_blocks=6)

        def forward(self, x):
            return self.body(x)

    torch.manual_seed(0)
    return RepeatedBlocksModel().eval()


# What every start that runs a compiled graph imports: Dynamo (torch.compile's front end), and the
# modules Inductor's generated code for a CPU graph imports. Timed alone, in a fresh process.
IMPORT_FLOOR_MODULES = ("torch._dynamo", "torch._inductor.async_compile", "torch._inductor.select_algorithm",
                        "torch._inductor.codegen.memory_planning", "torch._inductor.hooks")


def run_import_floor_child():
    import importlib

    start = time.perf_counter()
    for name in IMPORT_FLOOR_MODULES:
        importlib.import_module(name)
    print(CHILD_MARK + json.dumps({"mode": "import_floor", "wall_s": time.perf_counter() - start}), flush=True)


def run_child(mode):
    """One compile in this fresh process: the model on neuron, compiled, called once."""
    if mode == "import_floor":
        return run_import_floor_child()
    if mode == "transformer":
        model = _child_transformer()
    else:
        model = _child_repeated_model()
    x = transformer_input()
    with torch.no_grad():
        expected = model(x)
        model = model.to("neuron")
        xn = x.to("neuron")
        if mode != "transformer":
            # whole vs repeated compares the model's own compile: Inductor's one-off process setup
            # (imports, probing the host compiler's vector ISA: ~9 s in a fresh cache) is paid first.
            torch.compile(lambda t: torch.nn.functional.gelu(t) + 1, backend="neuron", **COMPILE_KW)(xn)
        neuron_dynamo_backend.reset_dynamo_metrics()
        start = time.perf_counter()
        if mode == "repeated":
            model.compile_repeated_blocks(backend="neuron", **COMPILE_KW)
            compiled = model
        else:
            compiled = compile_neuron(model)
        out = compiled(xn)
        wall_s = time.perf_counter() - start
    from torch._dynamo.utils import counters
    metrics = neuron_dynamo_backend.get_dynamo_metrics()
    out = out.cpu()
    print(CHILD_MARK + json.dumps({
        "mode": mode,
        "precompile": bool(torch._dynamo.config.caching_precompile),
        "frames_traced": counters["stats"]["unique_graphs"],
        "dynamo_cache": dict(counters["dynamo_cache"]),
        "wall_s": wall_s,
        "backend_s": common.backend_s(metrics),
        "graphs": len(metrics),
        "caches": [m["cache"] for m in metrics],
        "fell_back": any(m["fell_back"] for m in metrics),
        "metrics": metrics,
        "output_sha256": hashlib.sha256(out.numpy().tobytes()).hexdigest(),
        "max_abs_diff_vs_cpu_eager": (out - expected).abs().max().item(),
    }), flush=True)


def spawn_child(mode, cache_dir, threads, precompile=False):
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=cache_dir, TORCH_CACHING_PRECOMPILE="1" if precompile else "0")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the backend keeps Inductor's cache in the NEFF directory
    cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(threads), "--_child", mode]
    return common.run_child_process(cmd, env, CHILD_MARK, CHILD_TIMEOUT_S, mode=mode)


def warm_start_cases(threads, rounds):
    """Per round, in a fresh cache directory: a cold start (caching precompile on, so it stores the whole
    function too), then a warm start with the graph cache only and one with the precompiled function."""
    runs = {"cold": [], "warm": [], "warm_precompiled": [], "import_floor": []}
    for index in range(rounds):
        cache_dir = tempfile.mkdtemp(prefix="bench_compile_neff_")
        try:
            for label, precompile in (("cold", True), ("warm", False), ("warm_precompiled", True)):
                result = spawn_child("transformer", cache_dir, threads, precompile)
                _log_child(f"{label} (round {index + 1})", result)
                runs[label].append(result)
            runs["import_floor"].append(spawn_child("import_floor", cache_dir, threads))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    summary = {"rounds": rounds, "runs": runs, "target": 10.0}
    if any("error" in r for rs in runs.values() for r in rs):
        summary["error"] = "a child process failed"
        return summary
    for label in ("warm", "warm_precompiled"):
        pairs = list(zip(runs["cold"], runs[label]))
        summary[label] = {
            "wall_s": common.median_min_max([w["wall_s"] for _, w in pairs], n=True),
            "cold_over_warm_wall": common.median_min_max([c["wall_s"] / w["wall_s"] for c, w in pairs], n=True),
            "frames_traced": [w["frames_traced"] for _, w in pairs],
            "same_output_as_cold": all(c["output_sha256"] == w["output_sha256"] for c, w in pairs),
        }
    summary["cold_wall_s"] = common.median_min_max([c["wall_s"] for c in runs["cold"]], n=True)
    # No warm start that runs the graph can be shorter than these imports: cold / floor bounds the ratio.
    summary["import_floor_s"] = common.median_min_max([f["wall_s"] for f in runs["import_floor"]], n=True)
    summary["cold_over_import_floor"] = common.median_min_max(
        [c["wall_s"] / f["wall_s"] for c, f in zip(runs["cold"], runs["import_floor"])], n=True)
    precompiled = summary["warm_precompiled"]
    summary["ratio"] = precompiled["cold_over_warm_wall"]["median"]
    summary["pass"] = (summary["ratio"] >= summary["target"] and precompiled["same_output_as_cold"]
                       and not any(precompiled["frames_traced"]))
    return summary


def compile_time_cases(threads, rounds):
    results = {"warm_start": warm_start_cases(threads, rounds)}
    runs = results["warm_start"]["runs"]
    results["cold"], results["warm"] = runs["cold"][0], runs["warm"][0]
    for label, mode in (("whole", "whole"), ("repeated", "repeated")):
        cache_dir = tempfile.mkdtemp(prefix=f"bench_compile_{label}_")  # each its own, empty: both cold
        try:
            results[label] = spawn_child(mode, cache_dir, threads)
            _log_child(label, results[label])
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    cold, warm, whole, repeated = (results[k] for k in ("cold", "warm", "whole", "repeated"))
    if "error" not in cold and "error" not in warm:
        warm["ratio"] = cold["backend_s"] / max(warm["backend_s"], 1e-9)
        warm["all_hit"] = bool(warm["caches"]) and all(c == "hit" for c in warm["caches"])
        warm["same_output_as_cold"] = warm["output_sha256"] == cold["output_sha256"]
        warm["target"] = 10.0
        warm["pass"] = warm["ratio"] >= 10.0 and warm["all_hit"]
    if "error" not in whole and "error" not in repeated:
        repeated["ratio"] = repeated["wall_s"] / whole["wall_s"]
        repeated["target"] = 0.5
        repeated["pass"] = repeated["ratio"] <= 0.5
    return results


def _log_child(label, r):
    common.log_child(f"{label} compile", r, lambda r: (
        f"backend {r['backend_s']:.2f} s, compile + first call {r['wall_s']:.2f} s, "
        f"{r['graphs']} graph(s) {r['caches']}, {r['frames_traced']} frame(s) traced"))


# ---------------------------------------------------------------- report

def _spread_text(spread):
    return (f"rounds p10–p90 {spread['p10']:.3f}–{spread['p90']:.3f}, p25–p75 {spread['p25']:.3f}–"
            f"{spread['p75']:.3f}, {spread['rounds']} rounds")


def markdown(results, compile_results, threads, load):
    rows = []
    for r in results:
        rows.append([r["name"], f"{r['cpu_eager_us']:.1f}", f"{r['neuron_eager_us']:.1f}",
                     f"{r['inductor_cpu_us']:.1f}", f"{r['neuron_compiled_us']:.1f}", f"{r['ratio']:.3f}",
                     _spread_text(r["ratio_spread"]), f"≤ {r['target']:.2f}x", common.verdict(r["pass"])])
        if not r["equal_to_inductor"]:
            rows.append([f"⚠ {r['name']}: compiled neuron ≠ Inductor CPU (max abs diff "
                         f"{r['max_abs_diff_vs_inductor']:.3g})", *[""] * 6, "torch.equal", "WARN"])
    lines = [
        f"{common.conditions(load, threads=threads)}; median µs per call; the ratio is the median of interleaved "
        "per-round pairs (compiled neuron / Inductor CPU).",
        "",
        common.markdown_table(["case", "CPU eager µs", "neuron eager µs", "Inductor CPU µs", "neuron compiled µs",
                               "ratio vs Inductor", "ratio over rounds", "target", "result"], rows, align="lrrrrrlll"),
    ]
    if compile_results is None:
        return "\n".join(lines)
    cases = (
        ("cold", "transformer fwd, cold (fresh cache dir)", None),
        ("warm", "transformer fwd, warm (same cache dir, new process): the backend's own time, not the start",
         "cold / warm backend s"),
        ("whole", "6 blocks: torch.compile(whole model)", None),
        ("repeated", "6 blocks: compile_repeated_blocks", "repeated / whole wall s"),
    )
    rows = []
    for key, label, ratio_label in cases:
        r = compile_results[key]
        if "error" in r:
            rows.append([label, *["—"] * 6, f"FAILED: {r['error']}"])
            continue
        ratio = target = result = "—"
        if "ratio" in r:
            ratio = f"{r['ratio']:.1f}x {ratio_label}" if key == "warm" else f"{r['ratio']:.2f}x {ratio_label}"
            target = "backend s ≥ 10x, all 'hit'" if key == "warm" else "≤ 0.50x"
            result = common.verdict(r["pass"])
        rows.append([label, f"{r['backend_s']:.2f}", f"{r['wall_s']:.2f}", r["graphs"], common.counts_text(r["caches"]),
                     ratio, target, result])
    warm = compile_results["warm"]
    if "same_output_as_cold" in warm and not warm["same_output_as_cold"]:
        rows.append(["⚠ warm output ≠ cold output", *[""] * 5, "bitwise", "WARN"])
    lines += [
        "",
        "Compile time of the neuron backend, each in a fresh process: backend s = Σ over graphs of "
        "fx_passes + lower + compile (get_dynamo_metrics); wall s = compile call + first call.",
        "",
        common.markdown_table(["case", "backend s", "wall s", "graphs", "cache", "ratio", "target", "result"], rows,
                              align="lrrrlrll"),
        "",
        *warm_start_markdown(compile_results["warm_start"]),
    ]
    return "\n".join(lines)


def warm_start_markdown(summary):
    """The start (compile + first result) of a new process, warm against cold, per round."""
    if "error" in summary:
        return [f"Warm start: FAILED ({summary['error']})"]
    rows = [["cold (empty cache)", _median_min_max_text(summary["cold_wall_s"]), "—", "—", "—", "—"]]
    for label, title in (("warm", "warm, graph cache (Dynamo traces)"),
                         ("warm_precompiled", "warm, precompiled function (TORCH_CACHING_PRECOMPILE=1)")):
        r = summary[label]
        target = result = "—"
        if label == "warm_precompiled":
            target, result = f"≥ {summary['target']:.0f}x, 0 traced", common.verdict(summary["pass"])
        rows.append([title, _median_min_max_text(r["wall_s"]), max(r["frames_traced"]),
                     _median_min_max_text(r["cold_over_warm_wall"], "x"), target, result])
        if not r["same_output_as_cold"]:
            rows.append([f"⚠ {title}: output ≠ cold output", "", "", "", "bitwise", "WARN"])
    rows.append(["floor: importing Dynamo and the modules Inductor's generated code imports",
                 _median_min_max_text(summary["import_floor_s"]), "—",
                 f"{_median_min_max_text(summary['cold_over_import_floor'], 'x')} (the most any warm start can reach)",
                 "—", "—"])
    return [
        f"Start of a new process (compile + first result), transformer fwd, {summary['rounds']} round(s), each "
        "with its own cold process and cache; ratio = cold wall / warm wall, median [min, max] over rounds.",
        "",
        common.markdown_table(["start", "wall s median [min, max]", "frames traced", "cold / warm", "target", "result"],
                              rows, align="lrrrll"),
    ]


def _median_min_max_text(spread, unit=""):
    return f"{spread['median']:.2f}{unit} [{spread['min']:.2f}, {spread['max']:.2f}]"


def target_entries(results, compile_results):
    """The issue's targets for `benchmarks/targets.py`: run-time ratios per round, warm starts per round."""
    names = {"mlp_train_step": "compiled MLP train step (neuron/Inductor CPU)",
             "transformer_fwd": "compiled transformer fwd (neuron/Inductor CPU)"}
    entries = [target_entry(names[r["key"]], r["ratio_rounds"], r["target"]) for r in results]
    warm_start = (compile_results or {}).get("warm_start")
    if warm_start:
        runs = warm_start["runs"]
        per_round = [] if "error" in warm_start else [c["wall_s"] / w["wall_s"]
                                                      for c, w in zip(runs["cold"], runs["warm_precompiled"])]
        entries.append(target_entry("warm compiled start, end to end (cold/warm, precompiled)", per_round,
                              warm_start["target"], higher_is_better=True))
    return entries


def main():
    parser = common.arguments(__doc__)
    parser.add_argument("--only", choices=("train", "forward"),
                        help="run only this run-time case (no compile-time cases)")
    parser.add_argument("--compile-rounds", type=int, default=2, metavar="N",
                        help="rounds of cold and warm starts, each in its own cache directory (default 2)")
    parser.add_argument("--compile-only", action="store_true", help="only the compile-time cases")
    parser.add_argument("--_child", choices=("transformer", "whole", "repeated", "import_floor"),
                        help=argparse.SUPPRESS)
    opts = parser.parse_args()

    torch.set_num_threads(opts.threads)  # one process, so every variant shares the setting
    if opts._child:
        run_child(opts._child)
        return

    load = common.load_average()
    gc.disable()  # a collection landing inside one variant's loop is noise
    results = []
    if not opts.compile_only and opts.only in (None, "forward"):
        with torch.no_grad():
            results.append(measure("transformer_fwd", "transformer fwd (4 pre-LN blocks, b4 s128 d256)",
                                   forward_variants(), 10.0, 1.05))
    gc.collect()
    if not opts.compile_only and opts.only in (None, "train"):
        results.append(measure("mlp_train_step", "MLP train step (3x Linear 512, b64, AdamW)", training_variants(),
                               8.0, 1.03))
    gc.enable()
    compile_results = compile_time_cases(opts.threads, max(1, opts.compile_rounds)) if opts.only is None else None

    print(markdown(results, compile_results, opts.threads, load))
    if opts.json:
        meta = {"torch": torch.__version__, "threads": opts.threads, "cores": os.cpu_count(), "loadavg": load,
                "malloc_env": common.MALLOC_ENV}
        ratios = {r["key"]: {"ratio": r["ratio"], **r["ratio_spread"], "target": r["target"]} for r in results}
        targets = target_entries(results, compile_results)
        common.write_json(opts.json, {"meta": meta, "ratios": ratios, "targets": targets, "results": results,
                                      "compile": compile_results})
    misses = [r["name"] for r in results if not r["pass"]]
    misses += [k for k, r in (compile_results or {}).items() if r.get("pass") is False or "error" in r]
    warnings = [r["name"] for r in results if not r["equal_to_inductor"]]
    common.report_outcome(misses, warnings, "WARNING: compiled neuron differs from Inductor CPU in")


if __name__ == "__main__":
    main()
