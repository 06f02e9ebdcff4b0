"""The faithful compiled mode: the ``xla`` executor (TorchNeuron's StableHLO program, run by XLA:CPU)
against the default ``inductor`` executor and CPU eager.

Lowering: each graph lowered TorchNeuron's way (AOTAutograd, torch-mlir, StableHLO), with an empty
compile cache: the seconds of the lowering alone and the number of StableHLO ops, for bench_compile's
transformer forward, an MLP training step (its forward and backward graphs) and the demo's small
Flux2-Klein transformer. ``lower_us`` of ``get_dynamo_metrics()`` is reported as well; the graphs'
own seconds and op counts are recorded by observing the lowering function.

Per call, in this process, interleaved round by round with the order rotating: the transformer
forward as CPU eager, compiled neuron with ``executor="inductor"`` and with ``executor="xla"``;
then the demo pipeline at the demo's default size and steps, on CPU eager and with its transformer
compiled (``backend="neuron"``, fullgraph, static shapes) under each executor. Reported: medians,
min-max spread, and the largest absolute difference from CPU eager over every call.

Start-up, each in a fresh process: the transformer forward compiled with each executor, cold (an
empty cache directory) and warm (the same directory, a new process): seconds from the process's
launch to the first result, and backend seconds (get_dynamo_metrics: fx_passes + lower + compile).

    python benchmarks/bench_xla.py [--json PATH] [--threads N] [--rounds N] [--size PX] [--steps N]
"""
import copy
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

import bench_compile  # noqa: E402  (its models: the same transformer and MLP)
import bench_pipeline  # noqa: E402  (the same demo pipeline, its rounds and options)

import numpy as np  # noqa: E402
import torch  # noqa: E402  (autoloads the neuron backend)
import torch.nn.functional as F  # noqa: E402

from torch_neuronx.neuron_dynamo_backend.faithful import lowering_worker  # noqa: E402

EXECUTORS = ("inductor", "xla")
VARIANTS = ("cpu_eager", "inductor", "xla")
LABELS = {"cpu_eager": "CPU eager", "inductor": "neuron compiled, inductor", "xla": "neuron compiled, xla"}
COMPILE_KW = {"fullgraph": True, "dynamic": False}
SIZE, STEPS, ROUNDS = 512, 4, 5  # the demo's defaults
CHILD_MARK = "BENCH_XLA_RESULT "
CHILD_TIMEOUT_S = 300

_lowered = []  # (graph name, seconds, StableHLO op count) of every lowering in this process


def _observe_lowering():
    """Record each graph the backend lowers (in its worker process); the lowering itself is unchanged."""
    lower = lowering_worker.lower

    def observed(*args, **kwargs):
        result = lower(*args, **kwargs)
        _lowered.append((result.name, result.seconds, sum(result.op_counts.values())))
        return result

    lowering_worker.lower = observed


def compile_with(module, executor):
    return torch.compile(module, backend="neuron", options={"executor": executor}, **COMPILE_KW)


def _max_diff(a, b):
    a, b = (x.detach().to("cpu").double() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)
            for x in (a, b))
    return float((a - b).abs().max()) if isinstance(a, torch.Tensor) else float(np.abs(a - b).max())


# ---------------------------------------------------------------- lowering

def _lowering_row(name, run):
    """Compile and run ``run`` (xla executor) on the empty cache; the graphs it lowered, or the error
    of the one that does not lower."""
    torch.neuron.reset_dynamo_metrics()
    first = len(_lowered)
    start = time.perf_counter()
    error = None
    try:
        run()
    except Exception as e:  # noqa: BLE001 - a graph that does not lower is a result here
        error = str(e).split("NEFFCompilationError: ")[-1].split(". Set TORCH_NEURONX")[0].strip().splitlines()[0]
    wall_s = time.perf_counter() - start
    metrics = torch.neuron.get_dynamo_metrics()
    graphs = [{"graph": g, "lower_s": s, "stablehlo_ops": n} for g, s, n in _lowered[first:]]
    row = {"name": name, "graphs": graphs, "metrics": metrics, "wall_s": wall_s, "error": error,
           "metrics_lower_s": sum(m["lower_us"] for m in metrics) / 1e6,
           "caches": [m["cache"] for m in metrics]}
    print(f"  lowering, {name}: " + ", ".join(f"{g['lower_s']:.2f} s / {g['stablehlo_ops']} ops" for g in graphs)
          + f" (metrics lower_us {row['metrics_lower_s']:.2f} s, cache {row['caches']})"
          + (f"; FAILED: {error}" if error else ""), file=sys.stderr, flush=True)
    return row


class MLPSquaredError(bench_compile.MLPLoss):
    """bench_compile's MLP with the mean squared error written out: F.mse_loss's backward
    (aten.mse_loss_backward) does not lower to StableHLO with the stock decompositions."""

    def forward(self, x, y):
        return (self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))) - y).pow(2).mean()


def mlp_train_step(loss_module):
    """One forward + backward of an MLP loss, compiled with the xla executor."""
    torch.manual_seed(0)
    model = compile_with(loss_module().to("neuron"), "xla")
    gen = torch.Generator().manual_seed(2)
    x, y = (torch.randn(64, 512, generator=gen).to("neuron") for _ in range(2))
    model(x, y).backward()


# ---------------------------------------------------------------- per call: transformer forward

def transformer_variants():
    torch.manual_seed(0)
    model = bench_compile.SmallTransformer().eval()
    x = bench_compile.transformer_input()
    xn = x.to("neuron")
    compiled = {e: compile_with(copy.deepcopy(model).to("neuron"), e) for e in EXECUTORS}
    return {"cpu_eager": lambda: model(x), **{e: (lambda f=compiled[e]: f(xn)) for e in EXECUTORS}}


def measure_forward(budget_s, lowering_rows):
    variants = transformer_variants()
    first_call_s, outputs = {}, {}
    torch.neuron.reset_dynamo_metrics()
    first = len(_lowered)
    for v in VARIANTS:  # first call: compiles (the xla one lowers on the empty cache)
        start = time.perf_counter()
        outputs[v] = variants[v]()
        first_call_s[v] = time.perf_counter() - start
    metrics = torch.neuron.get_dynamo_metrics()
    xla_metrics = [m for m, g in zip(metrics, EXECUTORS) if g == "xla"]
    lowering_rows.append({
        "name": "transformer fwd (4 pre-LN blocks, b4 s128 d256)",
        "graphs": [{"graph": g, "lower_s": s, "stablehlo_ops": n} for g, s, n in _lowered[first:]],
        "metrics": xla_metrics, "metrics_lower_s": sum(m["lower_us"] for m in xla_metrics) / 1e6,
        "caches": [m["cache"] for m in xla_metrics], "wall_s": first_call_s["xla"]})
    diffs = {v: _max_diff(outputs[v], outputs["cpu_eager"]) for v in EXECUTORS}
    print("  transformer fwd: first calls " + ", ".join(f"{v} {first_call_s[v]:.1f} s" for v in VARIANTS)
          + "; max abs diff vs CPU eager " + ", ".join(f"{v} {diffs[v]:.3g}" for v in EXECUTORS),
          file=sys.stderr, flush=True)
    fns = {v: variants[v] for v in VARIANTS}
    samples, inner, rounds = common.interleaved_samples(fns, budget_s)
    for v in EXECUTORS:  # the largest difference, over a few more calls
        diffs[v] = max(diffs[v], *(_max_diff(fns[v](), outputs["cpu_eager"]) for _ in range(3)))
    result = {
        "name": "transformer fwd (4 pre-LN blocks, b4 s128 d256)", "unit": "µs", "inner": inner, "rounds": rounds,
        "per_call": {v: common.median_min_max(samples[v]) for v in VARIANTS},
        "ratio_xla_to_inductor": statistics.median(x / i for i, x in zip(samples["inductor"], samples["xla"])),
        "max_abs_diff_vs_cpu_eager": diffs, "first_call_s": first_call_s, "samples": samples,
    }
    print("  transformer fwd: " + " / ".join(f"{result['per_call'][v]['median']:.0f}" for v in VARIANTS) + " µs",
          file=sys.stderr, flush=True)
    return result


# ---------------------------------------------------------------- per call: the demo pipeline

def measure_pipeline(opts, lowering_rows):
    pipes = {"cpu_eager": bench_pipeline.load_pipeline("cpu")}
    first_call_s, images = {}, {}
    for v in VARIANTS:
        if v != "cpu_eager":
            pipes[v] = bench_pipeline.load_pipeline("neuron")
            pipes[v].transformer.compile(backend="neuron", options={"executor": v}, **COMPILE_KW)
        torch.neuron.reset_dynamo_metrics()
        first = len(_lowered)
        start = time.perf_counter()
        images[v] = bench_pipeline.generate(pipes[v], opts.size, opts.steps)  # compiles
        first_call_s[v] = time.perf_counter() - start
        if v == "xla":
            metrics = torch.neuron.get_dynamo_metrics()
            lowering_rows.append({
                "name": "Flux2-Klein transformer (the demo's tiny one), "
                        f"{opts.size}x{opts.size}",
                "graphs": [{"graph": g, "lower_s": s, "stablehlo_ops": n} for g, s, n in _lowered[first:]],
                "metrics": metrics, "metrics_lower_s": sum(m["lower_us"] for m in metrics) / 1e6,
                "caches": [m["cache"] for m in metrics], "wall_s": first_call_s[v]})
    diffs = {v: _max_diff(images[v], images["cpu_eager"]) for v in EXECUTORS}
    print("  pipeline: first calls " + ", ".join(f"{v} {first_call_s[v]:.1f} s" for v in VARIANTS),
          file=sys.stderr, flush=True)
    def compare(v, image):
        if v != "cpu_eager":
            diffs[v] = max(diffs[v], _max_diff(image, images["cpu_eager"]))

    samples = bench_pipeline.timed_rounds(pipes, VARIANTS, opts, compare)
    return {
        "name": f"demo pipeline, {opts.size}x{opts.size}, {opts.steps} steps", "unit": "s", "rounds": opts.rounds,
        "per_call": {v: common.median_min_max(samples[v]) for v in VARIANTS},
        "ratio_xla_to_inductor": statistics.median(x / i for i, x in zip(samples["inductor"], samples["xla"])),
        "max_abs_diff_vs_cpu_eager": diffs, "first_call_s": first_call_s, "samples": samples,
    }


# ---------------------------------------------------------------- start-up, in child processes

def run_child(executor, t0):
    imported = time.time() - t0
    torch.manual_seed(0)
    model = bench_compile.SmallTransformer().eval()
    x = bench_compile.transformer_input()
    with torch.no_grad():
        expected = model(x)
        model, xn = model.to("neuron"), x.to("neuron")
        torch.neuron.reset_dynamo_metrics()
        start = time.perf_counter()
        out = compile_with(model, executor)(xn).cpu()
        first_call_s = time.perf_counter() - start
    first_result_s = time.time() - t0
    metrics = torch.neuron.get_dynamo_metrics()
    print(CHILD_MARK + json.dumps({
        "executor": executor,
        "import_s": imported,
        "first_call_s": first_call_s,
        "first_result_s": first_result_s,
        "backend_s": common.backend_s(metrics),
        "lower_s": sum(m["lower_us"] for m in metrics) / 1e6,
        "compile_s": sum(m["compile_us"] for m in metrics) / 1e6,
        "metrics": metrics,
        "caches": [m["cache"] for m in metrics],
        "fell_back": any(m["fell_back"] for m in metrics),
        "max_abs_diff_vs_cpu_eager": (out - expected).abs().max().item(),
    }), flush=True)


def spawn_child(executor, cache_dir, threads):
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=cache_dir)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TORCH_NEURONX_NEFF_DISABLE_CACHE", "TORCH_NEURONX_COMPILE_EXECUTOR"):
        env.pop(name, None)  # a leftover would make "cold" warm, or choose the executor
    t0 = time.time()
    cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(threads), "--_child", executor,
           "--_t0", repr(t0)]
    return common.run_child_process(cmd, env, CHILD_MARK, CHILD_TIMEOUT_S, t0, executor=executor)


def startup_cases(threads):
    results = {}
    for executor in EXECUTORS:
        cache_dir = tempfile.mkdtemp(prefix=f"bench_xla_{executor}_")
        try:
            for label in ("cold", "warm"):  # one directory: the second process finds the first one's entries
                r = results[f"{executor} {label}"] = spawn_child(executor, cache_dir, threads)
                common.log_child(f"{executor} {label}", r, lambda r: (
                    f"first result {r['first_result_s']:.1f} s after launch, backend "
                    f"{r['backend_s']:.2f} s, {r['caches']}"))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return results


# ---------------------------------------------------------------- report

def markdown(lowering_rows, per_call, startup, opts, load, load_end, total_s):
    lowering = []
    for row in lowering_rows:
        if row.get("error"):
            done = ", ".join(f"{g['lower_s']:.2f} s / {g['stablehlo_ops']} ops" for g in row["graphs"])
            lowering.append([row["name"], f"{'lowered: ' + done + '; ' if done else ''}does not lower: {row['error']}",
                             "—", "—", "—"])
            continue
        for i, g in enumerate(row["graphs"]):
            kind = ("fw", "bw")[i] if len(row["graphs"]) == 2 else g["graph"]
            metric = f"{row['metrics_lower_s']:.2f}" if i == 0 else ""
            lowering.append([row["name"] if i == 0 else "", kind, f"{g['lower_s']:.2f}", g["stablehlo_ops"], metric])
    calls = []
    for r in per_call:
        fmt = (lambda s: f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f}) µs") if r["unit"] == "µs" else \
            (lambda s: f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) s")
        d = r["max_abs_diff_vs_cpu_eager"]
        calls.append([f"{r['name']} ({r['rounds']} rounds)", *(fmt(r["per_call"][v]) for v in VARIANTS),
                      f"{r['ratio_xla_to_inductor']:.2f}x", f"{d['inductor']:.2g}", f"{d['xla']:.2g}"])
    starts = []
    for executor in EXECUTORS:
        cold, warm = startup[f"{executor} cold"], startup[f"{executor} warm"]
        if "error" in cold or "error" in warm:
            starts.append([executor, f"FAILED: {cold.get('error') or warm.get('error')}", "", "", "", "", ""])
            continue
        starts.append([executor, f"{cold['first_result_s']:.1f} / {warm['first_result_s']:.1f}",
                       f"{cold['backend_s']:.2f} / {warm['backend_s']:.2f}",
                       f"{cold['lower_s']:.2f} / {warm['lower_s']:.2f}",
                       f"{cold['compile_s']:.2f} / {warm['compile_s']:.2f}",
                       f"{cold['backend_s'] / max(warm['backend_s'], 1e-9):.1f}x", ", ".join(warm["caches"])])
    return "\n".join([
        f"{common.conditions(load, load_end, total_s, opts.threads)}.",
        "",
        "Lowering (torch-mlir FxImporter -> StableHLO, TorchNeuron's f64->f32 pass), empty cache: per "
        "AOTAutograd graph, the seconds of the lowering alone and its StableHLO ops; metrics lower s = "
        "Σ lower_us of get_dynamo_metrics() for the case.",
        "",
        common.markdown_table(["case", "graph", "lower s", "StableHLO ops", "metrics lower s"], lowering,
                              align="llrrr"),
        "",
        "Per call: medians (min-max) over interleaved rounds; ratio = median of per-round xla / inductor; "
        "max diff = largest absolute difference from CPU eager over every checked call.",
        "",
        common.markdown_table(["case", "CPU eager", "inductor", "xla", "xla / inductor", "max diff inductor",
                               "max diff xla"], calls, align="lrrrrrr"),
        "",
        "Start-up of the transformer forward, each in a fresh process: first result = seconds from the "
        "process's launch (interpreter, imports included); backend s = Σ fx_passes + lower + compile "
        "(get_dynamo_metrics); lower s = its lower_us (the StableHLO lowering for xla; keying and the cache "
        "lookup for inductor); compile s = its compile_us (xla: AOTAutograd, XLA's compile or the cache load, "
        "the first import of jax and torch-mlir; inductor: AOTAutograd + Inductor, or the cache load).",
        "",
        common.markdown_table(["executor", "first result s cold / warm", "backend s cold / warm",
                               "lower s cold / warm", "compile s cold / warm", "cold / warm backend", "warm cache"],
                              starts, align="lrrrrrl"),
    ])


def main():
    parser = bench_pipeline.pipeline_arguments(__doc__, EXECUTORS, SIZE, STEPS, ROUNDS)
    opts = parser.parse_args()

    torch.set_num_threads(opts.threads)
    if opts._child:
        run_child(opts._child, opts._t0)
        return

    load = common.load_average()
    start = time.perf_counter()
    print(f"  load average {load:.1f}; pipeline {opts.size}x{opts.size}, {opts.steps} steps", file=sys.stderr,
          flush=True)
    bench_pipeline.quiet()
    from torch_neuronx.demo.pipelines import tiny_flux2_klein_path

    tiny_flux2_klein_path()
    _observe_lowering()
    os.environ.pop("TORCH_NEURONX_COMPILE_EXECUTOR", None)  # each compile names its executor
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cache_dir = tempfile.mkdtemp(prefix="bench_xla_neff_")
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = cache_dir  # empty: every lowering below is a cold one
    lowering_rows, per_call = [], []
    try:
        with torch.no_grad():
            per_call.append(measure_forward(10.0, lowering_rows))
        lowering_rows.append(_lowering_row("MLP train step (3x Linear 512, b64), (out - y).pow(2).mean()",
                                           lambda: mlp_train_step(MLPSquaredError)))
        lowering_rows.append(_lowering_row("MLP train step (3x Linear 512, b64), F.mse_loss",
                                           lambda: mlp_train_step(bench_compile.MLPLoss)))
        with torch.no_grad():
            per_call.append(measure_pipeline(opts, lowering_rows))
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    startup = startup_cases(opts.threads)
    load_end = common.load_average()
    total_s = time.perf_counter() - start

    print(markdown(lowering_rows, per_call, startup, opts, load, load_end, total_s))
    if opts.json:
        meta = {"torch": torch.__version__, "threads": opts.threads, "cores": os.cpu_count(), "loadavg": load,
                "loadavg_end": load_end, "total_s": total_s, "size": opts.size, "steps": opts.steps,
                "malloc_env": common.MALLOC_ENV}
        common.write_json(opts.json, {"meta": meta, "lowering": lowering_rows, "per_call": per_call,
                                      "startup": startup})
    failures = [k for k, r in startup.items() if "error" in r or r.get("fell_back")]
    common.report_outcome([], failures)


if __name__ == "__main__":
    main()
