"""The demo's Flux2-Klein pipeline end to end: CPU eager, neuron eager and compiled neuron.

Per call: the whole pipeline call (prompt encoding, the denoising steps, the VAE decode, as the
demo's ``generate`` runs it: ``torch.manual_seed``, then ``pipe(prompt=..., output_type="np")``)
of the small pipeline built in code (``tiny_flux2_klein_path``), float32, at one fixed size and
step count. Three pipelines live in this one process: one on CPU, one moved to neuron, and one
moved to neuron with its transformer compiled (``backend="neuron"``, fullgraph, static shapes;
the text encoder and the VAE stay eager, as in the demo). They run interleaved round by round,
the order rotating, so machine noise and frequency drift hit every variant alike. Reported: the
median time per call of each, and the medians of the per-round ratios neuron eager / CPU eager
and compiled neuron / CPU eager. Each pipeline's first call (the compile, for the compiled one)
is untimed; its image is checked against the CPU one then.

Start-up, each in a fresh process: load the pipeline, move it to neuron, compile the transformer
and make the first call, with TORCH_NEURONX_NEFF_CACHE_DIR on an empty directory (cold), then
again in a second process on the same directory (warm). Reported per process: the first call's
wall time (compile included), the time from the process's launch to the first image, the
cache result of every compiled graph (``torch.neuron.get_dynamo_metrics()``) and the ratio cold /
warm. These run first; the compiled pipeline of this process then loads its graph from the
same directory, so the compile (most of a minute here) is paid once; its run time does not depend on it.

    python benchmarks/bench_pipeline.py [--json PATH] [--threads N] [--rounds N] [--size PX] [--steps N]
"""
import argparse
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

import numpy as np  # noqa: E402
import torch  # noqa: E402  (autoloads the neuron backend)

VARIANTS = ("cpu_eager", "neuron_eager", "neuron_compiled")
LABELS = {"cpu_eager": "CPU eager", "neuron_eager": "neuron eager", "neuron_compiled": "neuron compiled"}
TARGETS = {"neuron_eager": ("≤", 1.10), "neuron_compiled": ("<", 1.00)}  # vs CPU eager
COMPILE_KW = {"fullgraph": True, "dynamic": False}
TOLERANCE = 1e-3  # max abs difference of the images (values in [0, 1])
SIZE, STEPS, SEED, ROUNDS = 256, 4, 0, 10
CHILD_MARK = "BENCH_PIPELINE_RESULT "
CHILD_TIMEOUT_S = 900


def quiet():
    """No progress bars (loading, denoising) on stderr."""
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()


def load_pipeline(device="cpu"):
    from diffusers import Flux2KleinPipeline

    from torch_neuronx.demo.pipelines import tiny_flux2_klein_path

    pipe = Flux2KleinPipeline.from_pretrained(tiny_flux2_klein_path(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def generate(pipe, size, steps):
    """The demo's call (its ``generate``): a step-distilled Klein, so guidance_scale 1.0 (none)."""
    from torch_neuronx.demo.cli import PROMPT

    torch.manual_seed(SEED)
    return pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=steps, output_type="np",
                guidance_scale=1.0).images[0]


def _diff(a, b):
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def _sha(image):
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


# ---------------------------------------------------------------- start-up, in child processes

def run_child(label, t0, size, steps, image_path):
    """One start-up in this fresh process: load, to neuron, compile, first call (and a second)."""
    imported = time.time() - t0
    quiet()
    pipe = load_pipeline("neuron")
    loaded = time.time() - t0
    torch.neuron.reset_dynamo_metrics()
    start = time.perf_counter()
    pipe.transformer.compile(backend="neuron", **COMPILE_KW)
    image = generate(pipe, size, steps)
    first_call_s = time.perf_counter() - start
    first_image_s = time.time() - t0
    metrics = torch.neuron.get_dynamo_metrics()
    start = time.perf_counter()
    second = generate(pipe, size, steps)
    second_call_s = time.perf_counter() - start
    np.save(image_path, image)
    print(CHILD_MARK + json.dumps({
        "label": label,
        "import_s": imported,  # from launch: interpreter, torch, the neuron backend, this script
        "loaded_s": loaded,  # from launch: ... and diffusers imported, the pipeline loaded and on neuron
        "first_call_s": first_call_s,
        "first_image_s": first_image_s,
        "second_call_s": second_call_s,
        "graphs": len(metrics),
        "caches": [m["cache"] for m in metrics],
        "compile_s": sum(m["compile_us"] for m in metrics) / 1e6,
        "backend_s": common.backend_s(metrics),
        "fell_back": any(m["fell_back"] for m in metrics),
        "metrics": metrics,
        "image_sha256": _sha(image),
        "second_equals_first": bool(np.array_equal(image, second)),
    }), flush=True)


def spawn_child(label, cache_dir, opts, image_path):
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=cache_dir)
    # The backend keeps Inductor's cache in the NEFF directory unless TORCHINDUCTOR_CACHE_DIR is set
    # (and sets it in its own process while compiling): a leftover would make "cold" warm.
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("TORCH_NEURONX_NEFF_DISABLE_CACHE", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(opts.threads), "--size", str(opts.size),
           "--steps", str(opts.steps), "--_child", label, "--_image", image_path]
    t0 = time.time()
    cmd += ["--_t0", repr(t0)]
    return common.run_child_process(cmd, env, CHILD_MARK, CHILD_TIMEOUT_S, t0, label=label)


def startup_cases(cache_dir, opts, image_dir):
    results = {}
    for label in ("cold", "warm"):  # one cache directory: the second process finds the first one's entries
        results[label] = spawn_child(label, cache_dir, opts, os.path.join(image_dir, f"{label}.npy"))
        common.log_child(f"{label} start", results[label], lambda r: (
            f"first call {r['first_call_s']:.1f} s, first image {r['first_image_s']:.1f} s "
            f"after launch, {r['graphs']} graph(s) {r['caches']}"))
    return results


# ---------------------------------------------------------------- per call, in this process

def run_time(opts):
    pipes = {"cpu_eager": load_pipeline("cpu"), "neuron_eager": load_pipeline("neuron"),
             "neuron_compiled": load_pipeline("neuron")}
    torch.neuron.reset_dynamo_metrics()
    pipes["neuron_compiled"].transformer.compile(backend="neuron", **COMPILE_KW)
    first_call_s, images = {}, {}
    for v in VARIANTS:  # first calls: lazy initialization, the compile (a cache load here); the check
        start = time.perf_counter()
        images[v] = generate(pipes[v], opts.size, opts.steps)
        first_call_s[v] = time.perf_counter() - start
    metrics = torch.neuron.get_dynamo_metrics()
    diffs = {v: _diff(images[v], images["cpu_eager"]) for v in VARIANTS[1:]}
    print("  first calls: " + ", ".join(f"{LABELS[v]} {first_call_s[v]:.1f} s" for v in VARIANTS)
          + f" (compiled graphs: {[m['cache'] for m in metrics]})", file=sys.stderr, flush=True)

    samples = timed_rounds(pipes, VARIANTS, opts)
    cpu = samples["cpu_eager"]
    result = {
        "rounds": opts.rounds,
        **{f"{v}_s": statistics.median(samples[v]) for v in VARIANTS},
        "ratios": {v: statistics.median(x / c for c, x in zip(cpu, samples[v])) for v in VARIANTS[1:]},
        "first_call_s": first_call_s,
        "max_abs_diff_vs_cpu": diffs,
        "images_agree": all(d < TOLERANCE for d in diffs.values()),
        "compiled_metrics": metrics,
        "compiled_image_sha256": _sha(images["neuron_compiled"]),
        "samples": samples,
    }
    result["pass"] = {v: (result["ratios"][v] <= t if op == "≤" else result["ratios"][v] < t)
                      for v, (op, t) in TARGETS.items()}
    return result, images["cpu_eager"]


# ---------------------------------------------------------------- report

def markdown(rt, startup, opts, load, load_end, total_s):
    rows = []
    for v in VARIANTS:
        if v == "cpu_eager":
            rows.append([LABELS[v], f"{rt[v + '_s']:.3f}", "—", "—", "—"])
            continue
        op, t = TARGETS[v]
        rows.append([LABELS[v], f"{rt[v + '_s']:.3f}", f"{rt['ratios'][v]:.3f}x", f"{op} {t:.2f}x",
                     common.verdict(rt["pass"][v])])
    lines = [
        f"{common.conditions(load, load_end, total_s, opts.threads)}.",
        "",
        f"The demo's small Flux2-Klein pipeline (built in code), float32, {opts.size}x{opts.size}, "
        f"{opts.steps} steps: median s per whole pipeline call over {rt['rounds']} interleaved rounds; "
        "ratios are medians of the per-round ratios to CPU eager. Compiled: the transformer only "
        "(backend='neuron', fullgraph, static shapes).",
        "",
        common.markdown_table(["variant", "s per call", "ratio vs CPU eager", "target", "result"], rows,
                              align="lrrll"),
    ]
    d = rt["max_abs_diff_vs_cpu"]
    lines += ["", f"Images (checked once): max abs diff vs CPU eager: neuron eager {d['neuron_eager']:.3g}, "
                  f"neuron compiled {d['neuron_compiled']:.3g} (tolerance {TOLERANCE:g}): "
                  f"{'agree' if rt['images_agree'] else 'DIFFER'}."]
    fc = rt["first_call_s"]
    lines.append("First (untimed) calls in this process: " + ", ".join(f"{LABELS[v]} {fc[v]:.1f} s" for v in VARIANTS)
                 + " (the compiled one loads its graph from the cold run's cache: "
                 + ", ".join(m["cache"] for m in rt["compiled_metrics"]) + ").")

    rows = []
    for label, text in (("cold", "cold (empty cache dir)"), ("warm", "warm (same dir, new process)")):
        r = startup[label]
        if "error" in r:
            rows.append([text, *["—"] * 6, f"FAILED: {r['error']}", "—"])
            continue
        rows.append([text, f"{r['import_s']:.1f}", f"{r['loaded_s']:.1f}", f"{r['first_call_s']:.2f}",
                     f"{r['first_image_s']:.2f}", f"{r['second_call_s']:.2f}", r["graphs"],
                     common.counts_text(r["caches"]), f"{r['compile_s']:.2f}"])
    cold, warm = startup["cold"], startup["warm"]
    both = "error" not in cold and "error" not in warm
    if both:
        rows.append(["cold / warm", "", "", f"{cold['first_call_s'] / warm['first_call_s']:.1f}x",
                     f"{cold['first_image_s'] / warm['first_image_s']:.1f}x", "", "", "",
                     f"{cold['compile_s'] / max(warm['compile_s'], 1e-9):.0f}x"])
    lines += [
        "",
        "Start-up of the compiled pipeline, each in a fresh process (load, .to('neuron'), compile the "
        "transformer, first call): first call = compile + call; first image = from the process's launch "
        "(interpreter, imports, loading included); torch up / pipeline on neuron = from the launch too; "
        "compile s = Σ compile_us of get_dynamo_metrics() (AOTAutograd + Inductor, or the cache load).",
        "",
        common.markdown_table(["run", "torch up s", "pipeline on neuron s", "first call s", "first image s",
                               "second call s", "graphs", "cache", "compile s"], rows, align="lrrrrrrlr"),
    ]
    if both:
        same = [f"warm = cold: {'yes' if warm['image_sha256'] == cold['image_sha256'] else 'NO'}",
                f"cold = this process's compiled: {'yes' if cold['image_sha256'] == rt['compiled_image_sha256'] else 'NO'}"]
        diffs = ", ".join(f"{k} {r['max_abs_diff_vs_cpu']:.3g}" for k, r in startup.items() if "max_abs_diff_vs_cpu" in r)
        lines += ["", f"Start-up images, bitwise: {'; '.join(same)}; max abs diff vs CPU eager: {diffs}."]
    return "\n".join(lines)


def timed_rounds(pipes: dict, variants, opts, on_image=None) -> dict:
    """``opts.rounds`` rounds of one generation per variant, in an order that rotates and then
    reverses (common.round_order), collecting garbage between calls only; returns seconds per call
    by variant. ``on_image(variant, image)`` sees each image. (Not common.interleaved_samples: one
    call per sample, a fixed number of rounds, and a collection after every call.)"""
    samples = {v: [] for v in variants}
    gc.collect()
    gc.disable()  # collections between the calls only, never inside one
    try:
        for r in range(opts.rounds):
            for v in common.round_order(variants, r):
                start = time.perf_counter()
                image = generate(pipes[v], opts.size, opts.steps)
                samples[v].append(time.perf_counter() - start)
                if on_image is not None:
                    on_image(v, image)
                gc.collect()
            print(f"  round {r + 1}/{opts.rounds}: " + " / ".join(f"{samples[v][-1]:.2f}" for v in variants) + " s",
                  file=sys.stderr, flush=True)
    finally:
        gc.enable()
    return samples


def pipeline_arguments(doc: str, children, size: int = SIZE, steps: int = STEPS,
                       rounds: int = ROUNDS) -> argparse.ArgumentParser:
    """The options of a benchmark of the pipeline; ``children`` are the values of its hidden
    --_child (the start-up runs it launches as new processes)."""
    parser = common.arguments(doc)
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds (one call of each variant)")
    parser.add_argument("--size", type=int, default=size, help="height and width in pixels")
    parser.add_argument("--steps", type=int, default=steps, help="num_inference_steps")
    parser.add_argument("--_child", choices=children, help=argparse.SUPPRESS)
    parser.add_argument("--_t0", type=float, help=argparse.SUPPRESS)
    return parser


def main():
    parser = pipeline_arguments(__doc__, ("cold", "warm"))
    parser.add_argument("--_image", help=argparse.SUPPRESS)
    opts = parser.parse_args()

    torch.set_num_threads(opts.threads)
    if opts._child:
        run_child(opts._child, opts._t0, opts.size, opts.steps, opts._image)
        return

    load = common.load_average()
    start = time.perf_counter()
    print(f"  {opts.size}x{opts.size}, {opts.steps} steps, float32; load average {load:.1f}", file=sys.stderr, flush=True)
    quiet()
    from torch_neuronx.demo.pipelines import tiny_flux2_klein_path

    tiny_flux2_klein_path()  # built and saved once, before the children race for it
    cache_dir = tempfile.mkdtemp(prefix="bench_pipeline_neff_")
    image_dir = tempfile.mkdtemp(prefix="bench_pipeline_img_")
    try:
        startup = startup_cases(cache_dir, opts, image_dir)
        os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = cache_dir  # read at each compile
        rt, cpu_image = run_time(opts)
        for label, r in startup.items():
            path = os.path.join(image_dir, f"{label}.npy")
            if "error" not in r and os.path.exists(path):
                r["max_abs_diff_vs_cpu"] = _diff(np.load(path), cpu_image)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
        shutil.rmtree(image_dir, ignore_errors=True)
    load_end = common.load_average()
    total_s = time.perf_counter() - start

    print(markdown(rt, startup, opts, load, load_end, total_s))
    if opts.json:
        meta = {"torch": torch.__version__, "threads": opts.threads, "cores": os.cpu_count(), "loadavg": load,
                "loadavg_end": load_end, "total_s": total_s, "size": opts.size, "steps": opts.steps,
                "dtype": "float32", "malloc_env": common.MALLOC_ENV}
        common.write_json(opts.json, {"meta": meta, "run_time": rt, "startup": startup})
    misses = [LABELS[v] for v, ok in rt["pass"].items() if not ok]
    failures = [k for k, r in startup.items() if "error" in r]
    failures += [] if rt["images_agree"] else ["images differ from CPU eager"]
    failures += [k for k, r in startup.items() if r.get("max_abs_diff_vs_cpu", 0.0) >= TOLERANCE]
    common.report_outcome(misses, failures)


if __name__ == "__main__":
    main()
