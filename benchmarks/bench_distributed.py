"""Collectives and tensor parallelism on the ``neuron`` c10d backend, each run under torchrun.

all_reduce: 2 ranks, one process each. Three variants, interleaved round by round (the order
rotating), so machine noise hits them alike: (a) a plain Gloo group on CPU tensors, the baseline;
(b) the default ``neuron`` group on neuron tensors, with its per-collective check that all ranks
call the same op on the same shapes (the default); (c) a ``neuron`` group created with
TORCH_NEURONX_COLLECTIVE_CHECKS=0 on neuron tensors. Gloo runs on CPU aliases of the neuron memory,
so (c) should cost what (a) does. Reported per size: rank 0's median time per all_reduce,
algorithmic bandwidth (bytes / time), and the medians of the per-round ratios b/a and c/a with
their spread over the rounds (quartiles). Every variant's result is checked once per size (known
values, in place). Targets: b/a and c/a <= 1.10 from 4 MiB on (Gloo's own cost dominates), and
b/a <= 1.30 at 4 KiB (the check's cost shows most); the --json file carries the 4 KiB one as
``allreduce.small_target`` ({"bytes", "target", "ratio_checked", "ratio_checked_q1",
"ratio_checked_q3", "rounds", "met"}).

Tensor parallelism: a small Flux2 transformer (diffusers) sharded with ``enable_parallelism``
over 1, 2 and 4 ranks, each a torchrun launch of its own. A launch cannot hold another world size,
so the launches run twice, in mirrored order (1, 2, 4, then 4, 2, 1), and each size's forwards are
pooled: drift in the machine's load then hits every size alike. Reported: rank 0's median time per
forward, the speedup over 1 rank, and the largest difference of rank 0's output from the unsharded
CPU model's. Every rank gets the same number of threads (torchrun's default of 1, set here for 1
rank too). For reference: 2 ranks with the collective checks off (in both passes: a sharded
forward runs several all_reduces, and each pays the check's exchange), and, once between the
passes, 1 rank with a thread per core.

    python benchmarks/bench_distributed.py [--json PATH] [--tp-threads N] [--allreduce-only]
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import common  # beside this script (sys.path[0])

# First: re-exec this script when the MALLOC_* settings are missing; torchrun's workers inherit them.
common.apply_malloc_env()

from targets import target as target_entry  # noqa: E402

import torch  # noqa: E402  (autoloads the neuron backend)
import torch.distributed as dist  # noqa: E402

from torch_neuronx.distributed import CHECKS_ENV  # noqa: E402

AR_VARIANTS = ("gloo_cpu", "neuron_checked", "neuron_unchecked")
AR_SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)  # bytes of float32
AR_BUDGET_S = 5.0  # timed rounds per size, all variants together
AR_CHUNK_S = 0.02  # one sample is a loop of about this long (a small all_reduce takes ms here)
AR_TARGET = 1.10  # neuron / Gloo CPU, for the sizes from AR_TARGET_FROM on
AR_TARGET_FROM = 4 << 20
AR_SMALL_TARGET = 1.30  # neuron with checks on / Gloo CPU, at AR_SMALL_TARGET_AT
AR_SMALL_TARGET_AT = 4 << 10

TP_RANKS = (1, 2, 4)
TP_TOKENS = (256, 64)  # image tokens (a 16x16 grid), text tokens
TP_WARMUP, TP_REPS = 3, 10  # per launch; two launches per world size
TP_TOLERANCE = 1e-4
LAUNCH_TIMEOUT_S = 600


# ---------------------------------------------------------------- launching

def launch(nproc, worker, threads=None, checks=None):
    """Run this file under torchrun with `nproc` processes; return what rank 0 wrote (or the error)."""
    fd, out_path = tempfile.mkstemp(prefix="bench_dist_", suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    if threads is not None:  # torchrun sets OMP_NUM_THREADS=1 only for more than one process
        env["OMP_NUM_THREADS"] = str(threads)
    if checks is not None:  # the neuron groups' collective checks, whatever the caller's environment says
        env[CHECKS_ENV] = "1" if checks else "0"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
           os.path.abspath(__file__), "--_worker", worker, "--_out", out_path]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
        with open(out_path) as f:
            text = f.read()
        if proc.returncode != 0 or not text:
            return {"error": f"exit code {proc.returncode}", "stderr": proc.stderr[-4000:]}
        result = json.loads(text)
    except subprocess.TimeoutExpired as e:
        return common.timed_out(e, LAUNCH_TIMEOUT_S)
    finally:
        os.unlink(out_path)
    result["launch_s"] = time.perf_counter() - start
    return result


def _report(out_path, result):
    if dist.get_rank() == 0:  # only rank 0 reports
        with open(out_path, "w") as f:
            json.dump(result, f)


# ---------------------------------------------------------------- all_reduce worker

def allreduce_worker(out_path):
    # (b) is the default group, with checks whatever the caller's environment says; (c) is a
    # second neuron group, made while the switch is off (the backend reads it at creation).
    saved = os.environ.get(CHECKS_ENV)
    os.environ[CHECKS_ENV] = "1"
    dist.init_process_group(backend="neuron")
    gloo = dist.new_group(backend="gloo")
    os.environ[CHECKS_ENV] = "0"
    unchecked = dist.new_group(backend="neuron")
    if saved is None:
        del os.environ[CHECKS_ENV]
    else:
        os.environ[CHECKS_ENV] = saved
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", torch.neuron.current_device())
    groups = {"gloo_cpu": (gloo, "cpu"), "neuron_checked": (dist.group.WORLD, dev),
              "neuron_unchecked": (unchecked, dev)}

    results = []
    for nbytes in AR_SIZES:
        n = nbytes // 4
        correct = check_allreduce(groups, n, rank, world, gloo)
        # Timing repeats the sum in place; zeros stay zeros (no overflow, no denormals), and adding
        # zeros costs Gloo what adding any other floats does.
        tensors = {v: torch.zeros(n, device=d) for v, (_, d) in groups.items()}
        fns = {v: (lambda g=groups[v][0], t=tensors[v]: dist.all_reduce(t, group=g)) for v in AR_VARIANTS}

        def slowest_on_any_rank(per_call_s):
            """Both ranks must run the same number of collectives: agree on the slowest estimate."""
            per_call = torch.tensor([per_call_s])
            dist.all_reduce(per_call, op=dist.ReduceOp.MAX, group=gloo)
            return per_call.item()

        # Warm-up (Gloo's buffers, the checks' first exchange), then the rounds. No barrier between
        # samples: the collectives themselves keep the ranks in step.
        gc.disable()  # a collection inside one variant's loop is noise (and would stall the peer)
        samples, inner, rounds = common.interleaved_samples(fns, AR_BUDGET_S, chunk_s=AR_CHUNK_S,
                                                            agree=slowest_on_any_rank)
        gc.enable()
        base = samples["gloo_cpu"]
        ratios = {key: [x / a for a, x in zip(base, samples[v])]
                  for key, v in (("ratio_checked", "neuron_checked"), ("ratio_unchecked", "neuron_unchecked"))}
        results.append({
            "bytes": nbytes,
            "inner": inner,
            "rounds": rounds,
            "correct": correct,
            **{f"{v}_us": statistics.median(samples[v]) for v in AR_VARIANTS},
            **{key: statistics.median(r) for key, r in ratios.items()},
            **{f"{key}_{q}": x for key, r in ratios.items() for q, x in zip(("q1", "q3"), common.quartiles(r))},
            "samples": samples,
        })
        del tensors, fns
    _report(out_path, {"world": world, "threads": torch.get_num_threads(), "sizes": results})
    dist.destroy_process_group()


def small_target(ar):
    """The 4 KiB target's numbers (checks on vs Gloo CPU), or None without that size."""
    for r in ar.get("sizes", []):
        if r["bytes"] == AR_SMALL_TARGET_AT:
            return {"bytes": r["bytes"], "target": AR_SMALL_TARGET, "ratio_checked": r["ratio_checked"],
                    "ratio_checked_q1": r["ratio_checked_q1"], "ratio_checked_q3": r["ratio_checked_q3"],
                    "rounds": r["rounds"], "met": r["ratio_checked"] <= AR_SMALL_TARGET}
    return None


def target_entries(ar):
    """The 4 KiB target for `benchmarks/targets.py`: checks on vs Gloo on CPU tensors, per round."""
    sizes = [r for r in ar.get("sizes", []) if r["bytes"] == AR_SMALL_TARGET_AT]
    per_round = [b / a for a, b in zip(sizes[0]["samples"]["gloo_cpu"], sizes[0]["samples"]["neuron_checked"])] \
        if sizes else []
    return [target_entry(f"all_reduce {_size(AR_SMALL_TARGET_AT)}, checks on (neuron/Gloo CPU)", per_round,
                         AR_SMALL_TARGET)]


def check_allreduce(groups, n, rank, world, gloo):
    """Each variant sums known values in place; True when every rank got the exact sums."""
    base = torch.arange(n) % 251  # small integers: float32 sums stay exact
    expected = (base * world + sum(range(world))).float()
    ok = True
    for group, device in groups.values():
        x = (base + rank).float().to(device)
        ptr = x.data_ptr()
        dist.all_reduce(x, group=group)
        ok &= x.data_ptr() == ptr and torch.equal(x.cpu(), expected)
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=gloo)
    return bool(flag.item())


# ---------------------------------------------------------------- tensor-parallel worker

def flux2_model():
    import diffusers

    torch.manual_seed(0)  # every rank builds the same weights
    return diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=32,
        num_attention_heads=8, joint_attention_dim=64, timestep_guidance_channels=32,
        axes_dims_rope=(8, 8, 8, 8), guidance_embeds=False).eval()


def flux2_inputs():
    img, txt = TP_TOKENS
    side = int(img ** 0.5)
    img_ids = torch.zeros(img, 4, dtype=torch.int64)  # (t, h, w, l) position per image token
    img_ids[:, 1], img_ids[:, 2] = torch.arange(img) // side, torch.arange(img) % side
    gen = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(1, img, 16, generator=gen),
        "encoder_hidden_states": torch.randn(1, txt, 64, generator=gen),
        "timestep": torch.tensor([0.5]),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(txt, 4, dtype=torch.int64),
    }


def tp_worker(out_path):
    import diffusers
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group(backend="neuron")  # before any neuron tensor: binds this rank's core
    rank, world = dist.get_rank(), dist.get_world_size()
    model, inputs = flux2_model(), flux2_inputs()
    with torch.no_grad():
        reference = model(**inputs).sample if rank == 0 else None  # the unsharded model, on CPU
    mesh = DeviceMesh("neuron", list(range(world)))
    model.enable_parallelism(config=diffusers.TensorParallelConfig(mesh=mesh))
    dev = torch.device("neuron", torch.neuron.current_device())
    model.to(dev)
    inputs = {k: v.to(dev) for k, v in inputs.items()}
    times = []
    with torch.no_grad():
        for i in range(TP_WARMUP + TP_REPS):
            dist.barrier()  # start every forward together: the first collective would absorb the skew
            start = time.perf_counter()
            out = model(**inputs).sample
            elapsed = time.perf_counter() - start
            if i >= TP_WARMUP:
                times.append(elapsed * 1e3)
    result = {"world": world, "threads": torch.get_num_threads(), "times_ms": times,
              "median_ms": statistics.median(times)}
    if rank == 0:
        result["max_abs_diff"] = (out.cpu() - reference).abs().max().item()
    _report(out_path, result)
    dist.destroy_process_group()


# ---------------------------------------------------------------- report

def _gbps(nbytes, us):
    return f"{nbytes / us / 1e3:.3g}"  # bytes per µs / 1e3 = GB/s; 3 digits: small sizes are ~0.002


def _size(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def markdown(ar, tp, load, load_end):
    cores = os.cpu_count()
    lines = [f"{common.conditions(load, load_end)}."]
    lines += ["", "all_reduce (sum, float32), 2 ranks"]
    if "error" in ar:
        lines.append(f"FAILED: {ar['error']}")
    else:
        lines += [
            f"{ar['threads']} thread(s) per rank; median µs per all_reduce on rank 0 (GB/s = bytes / time); "
            "ratios are medians of interleaved per-round pairs. (a) Gloo group, CPU tensors; (b) neuron group, "
            "neuron tensors, checks on (default); (c) neuron group, neuron tensors, checks off.",
            "",
        ]
        rows = []
        for r in ar["sizes"]:
            a, b, c = (r[f"{v}_us"] for v in AR_VARIANTS)
            target = result = "—"
            if r["bytes"] >= AR_TARGET_FROM:
                target = f"≤ {AR_TARGET:.2f}x"
                result = " / ".join(f"{k} {common.verdict(x <= AR_TARGET)}"
                                    for k, x in (("b", r["ratio_checked"]), ("c", r["ratio_unchecked"])))
            elif r["bytes"] == AR_SMALL_TARGET_AT:
                target = f"b ≤ {AR_SMALL_TARGET:.2f}x"
                result = f"b {common.verdict(r['ratio_checked'] <= AR_SMALL_TARGET)}"
            rows.append([
                _size(r["bytes"]), f"{a:.0f}", _gbps(r["bytes"], a), f"{b:.0f}", _gbps(r["bytes"], b),
                f"{c:.0f}", _gbps(r["bytes"], c), f"{r['ratio_checked']:.3f}",
                f"{r['ratio_checked_q1']:.2f}–{r['ratio_checked_q3']:.2f}", f"{r['ratio_unchecked']:.3f}",
                f"{r['ratio_unchecked_q1']:.2f}–{r['ratio_unchecked_q3']:.2f}", r["rounds"],
                "yes" if r["correct"] else "NO", target, result])
        lines.append(common.markdown_table(
            ["size", "(a) Gloo CPU µs", "GB/s", "(b) neuron checked µs", "GB/s", "(c) neuron unchecked µs", "GB/s",
             "b/a", "b/a quartiles", "c/a", "c/a quartiles", "rounds", "correct", "target", "result"],
            rows, align="lrrrrrrrrrrrlll"))
        large = [r for r in ar["sizes"] if r["bytes"] >= AR_TARGET_FROM]
        lines.append("")
        small = small_target(ar)
        if small:
            lines.append(
                f"Target, neuron with checks on ≤ {AR_SMALL_TARGET:.2f}x Gloo CPU at {_size(small['bytes'])}: "
                f"{'met' if small['met'] else 'NOT met'} ({small['ratio_checked']:.2f}x, median of {small['rounds']} "
                f"rounds; middle half {small['ratio_checked_q1']:.2f}–{small['ratio_checked_q3']:.2f}x).")
        for label, key in (("checks on (b)", "ratio_checked"), ("checks off (c)", "ratio_unchecked")):
            ratios = ", ".join(f"{r[key]:.2f}x at {_size(r['bytes'])}" for r in large)
            met = "met" if all(r[key] <= AR_TARGET for r in large) else "NOT met"
            lines.append(f"Target, neuron ≤ {AR_TARGET:.2f}x Gloo CPU from {_size(AR_TARGET_FROM)} on, "
                         f"{label}: {met} ({ratios}).")
    if not tp:  # --allreduce-only
        return "\n".join(lines)
    img, txt = TP_TOKENS
    lines += [
        "",
        f"Flux2 tensor-parallel forward (2+2 blocks, 8 heads x 32, {img} image + {txt} text tokens), "
        f"rank 0's median of {TP_REPS} forwards (after {TP_WARMUP} warm-up) per launch, pooled over the launches; "
        f"max abs diff vs the unsharded CPU model (tolerance {TP_TOLERANCE:g}). Collective checks on (the default) "
        "unless noted.",
        "",
    ]
    rows = []
    base = tp[1]["median_ms"] if 1 in tp and "error" not in tp[1] else None
    for key, r in tp.items():
        n = r["ranks"]
        if "error" in r:
            rows.append([n, "—", "—", "—", "—", "—", f"FAILED: {r['error']}"])
            continue
        notes = [r["note"]] if r["note"] else []
        if n * r["threads"] > cores:
            notes.append(f"oversubscribed: {n} x {r['threads']} thread(s) on {cores} cores")
        note = "; ".join(notes)
        diff_ok = "" if r["max_abs_diff"] < TP_TOLERANCE else " ⚠ MISMATCH"
        speedup = f"{base / r['median_ms']:.2f}x" if base else "—"
        rows.append([n, r["threads"], len(r["launches"]), f"{r['median_ms']:.1f}", speedup,
                     f"{r['max_abs_diff']:.2g}{diff_ok}", note])
    lines.append(common.markdown_table(
        ["ranks", "threads/rank", "launches", "ms per forward", "speedup vs 1 rank", "max abs diff", "note"],
        rows, align="rrrrrrl"))
    return "\n".join(lines)


def run_tp(schedule):
    """Launch each (key, ranks, threads, checks, note) in turn; pool the forward times per key."""
    tp = {}
    for key, n, threads, checks, note in schedule:
        r = launch(n, "tp", threads, checks)
        entry = tp.setdefault(key, {"ranks": n, "checks": checks, "note": note, "launches": [], "times_ms": []})
        entry["launches"].append(r)
        if "error" in r:
            entry["error"] = r["error"]
            print(f"  TP {n} rank(s): FAILED ({r['error']})\n{r['stderr']}", file=sys.stderr, flush=True)
            continue
        entry["times_ms"] += r["times_ms"]
        entry["threads"] = r["threads"]
        entry["max_abs_diff"] = max(entry.get("max_abs_diff", 0.0), r["max_abs_diff"])
        entry["median_ms"] = statistics.median(entry["times_ms"])
        print(f"  TP {n} rank(s), {r['threads']} thread(s): {r['median_ms']:.1f} ms in this launch "
              f"({r['launch_s']:.0f} s with start-up), max abs diff {r['max_abs_diff']:.2g}", file=sys.stderr, flush=True)
    return tp


def main():
    parser = common.arguments(__doc__, threads=False)
    parser.add_argument("--tp-threads", type=int, default=1,
                        help="intra-op threads per rank in the tensor-parallel runs (torchrun's default: 1)")
    parser.add_argument("--allreduce-only", action="store_true", help="skip the tensor-parallel launches")
    parser.add_argument("--_worker", choices=("allreduce", "tp"), help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts._worker == "allreduce":
        return allreduce_worker(opts._out)
    if opts._worker == "tp":
        return tp_worker(opts._out)

    load = common.load_average()
    start = time.perf_counter()
    ar = launch(2, "allreduce")
    if "error" in ar:
        print(f"  all_reduce: FAILED ({ar['error']})\n{ar['stderr']}", file=sys.stderr, flush=True)
    else:
        for r in ar["sizes"]:
            print(f"  all_reduce {_size(r['bytes'])}: " + " / ".join(f"{r[v + '_us']:.0f}" for v in AR_VARIANTS)
                  + " µs", file=sys.stderr, flush=True)
    pass_ = [(n, n, opts.tp_threads, True, "") for n in TP_RANKS]
    pass_.insert(2, ("2_unchecked", 2, opts.tp_threads, False, f"reference: collective checks off ({CHECKS_ENV}=0)"))
    middle = [("1_all_cores", 1, os.cpu_count(), True, "reference: 1 rank, a thread per core")]
    if opts.tp_threads == os.cpu_count():
        middle = []
    tp = {} if opts.allreduce_only else run_tp(pass_ + middle + pass_[::-1])

    load_end = common.load_average()
    print(markdown(ar, tp, load, load_end))
    print(f"\n(total {time.perf_counter() - start:.0f} s)")
    if opts.json:
        meta = {"torch": torch.__version__, "cores": os.cpu_count(), "loadavg": load, "loadavg_end": load_end,
                "malloc_env": common.MALLOC_ENV, "tp_tokens": TP_TOKENS, "ar_sizes": AR_SIZES}
        ar_out = dict(ar, small_target=small_target(ar)) if "sizes" in ar else ar
        common.write_json(opts.json, {"meta": meta, "targets": target_entries(ar), "allreduce": ar_out,
                                      "tp": {str(k): v for k, v in tp.items()}})
    misses = [f"all_reduce {_size(r['bytes'])}" for r in ar.get("sizes", [])
              if r["bytes"] >= AR_TARGET_FROM and max(r["ratio_checked"], r["ratio_unchecked"]) > AR_TARGET]
    small = small_target(ar)
    misses += [f"all_reduce {_size(small['bytes'])} with checks"] if small and not small["met"] else []
    failures = [f"all_reduce {_size(r['bytes'])} wrong" for r in ar.get("sizes", []) if not r["correct"]]
    failures += ["all_reduce"] if "error" in ar else []
    failures += [f"TP {k}" for k, r in tp.items() if "error" in r or r["max_abs_diff"] >= TP_TOLERANCE]
    common.report_outcome(misses, failures)


if __name__ == "__main__":
    main()
