"""The simulator at full size: `python -m torch_neuronx.simulate` on a Llama-style 8B model with
TP=8 x FSDP=8 over the 64 ranks of a trn2.48xlarge (structure mode), the same model reduced in
depth and width under --numerics on the same 64 ranks (TP=8 x FSDP=8, against one device), the
Flux2 transformer at its 4B (FLUX.2-klein-4B) configuration, tensor parallel over the 4 cores of a
trn2.3xlarge, and a Llama-style 1B (Llama 3.2 1B's shape) under DDP on the 64 ranks of a
trn2.48xlarge, its gradient buckets' all-reduces in the plan.

Measures the wall time and the peak memory of the whole simulation (the resident memory of the
parent and its ranks' children, two at a time, summed, sampled every 0.2 s: an upper bound, as the
children share the parent's pages), and reads the plan: per-rank peak bytes against HBM and the
collectives.
Targets (issue 27): the 8B check under 10 minutes and under 8 GiB on a 2-core machine; the
numerics equal to one device. The machine's load average is recorded with each run: on a shared
machine the wall times are noisy."""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import common  # noqa: F401  (beside this file; no torch)
import targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "tests", "programs", "simulate")
GiB = 1 << 30


def _rss(pid):
    """Resident bytes of pid and its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            pass
    return total


LLAMA_1B = ["--layers", "16", "--hidden", "2048", "--ffn", "8192", "--heads", "32", "--kv-heads", "8",
            "--vocab", "128256", "--seq", "2048", "--tp", "1", "--ddp", "--steps", "2"]
NUMERICS_LLAMA = ["--layers", "2", "--hidden", "256", "--ffn", "512", "--heads", "16", "--kv-heads", "8", "--vocab",
                  "512", "--seq", "32", "--batch", "2", "--dtype", "float32", "--tp", "8"]


def run_simulator(args, out):
    """`python -m torch_neuronx.simulate --quiet --out OUT ARGS`, timed, its peak resident memory
    sampled: (the measurements as a dict, the plan it wrote)."""
    cmd = [sys.executable, "-m", "torch_neuronx.simulate", "--quiet", "--out", out, *args]
    load_before = os.getloadavg()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, peak = time.perf_counter(), 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        peak = max(peak, _rss(proc.pid))
        time.sleep(0.2)
    stdout, stderr = proc.communicate()
    elapsed = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the simulator and its rank processes: what a loaded machine does not change
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    with open(os.path.join(out, "plan.json")) as f:
        plan = json.load(f)
    return {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "seconds": elapsed, "cpu_seconds": cpu,
            "peak_rss_bytes": peak,
            "load_average_1min": [load_before[0], os.getloadavg()[0]],
            "stdout": stdout[-2000:], "stderr": stderr[-2000:]}, plan


def simulate(args, out):
    measured, plan = run_simulator(args, out)
    return {**measured, "plan": summary(plan)}


def summary(plan):
    if plan.get("mode") == "numerics":
        num = plan["numerics"]
        return {"world_size": plan["world_size"], "ok": num["ok"], "missing": num["missing"],
                "max_abs_difference": {k: v["max_abs_difference"] for k, v in num["outputs"].items()}}
    ranks = plan["ranks"]
    peaks = [r["peak_bytes"] for r in ranks]
    ops = {}
    for c in ranks[0]["collectives"] if ranks else []:
        ops[c["op"]] = ops.get(c["op"], 0) + c["calls"]
    return {"world_size": plan["world_size"], "capacity_bytes": plan["capacity_bytes"],
            "peak_bytes_min": min(peaks, default=0), "peak_bytes_max": max(peaks, default=0),
            "per_rank_peak_bytes": peaks, "over_capacity": len(plan["over_capacity"]),
            "rank0_collectives": ranks[0]["collective_calls"] if ranks else 0, "rank0_collectives_by_op": ops,
            "communication_seconds": plan["communication"]["seconds"], "step_seconds": plan["time"]["step_seconds"], "divergence": plan["divergence"],
            "script_runs": plan["simulation"]["script_runs"], "symmetry": plan["simulation"].get("symmetry"),
            "errors": [r["error"] for r in ranks if "error" in r], "backward_overlap": _buckets(plan)}


def _buckets(plan):
    """Rank 0's DDP buckets per backward: their all-reduces' bytes, the time hidden and after."""
    return [{"all_reduce_bytes": [c["bytes"] for c in b["calls"]], "line": b["calls"][0]["line"],
             "hidden_seconds": b["hidden_seconds"], "exposed_seconds": b["exposed_seconds"]}
            for b in (plan.get("time") or {}).get("backward_overlap", [])]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--only", choices=("llama", "numerics", "flux", "ddp", "verify"), default=None,
                        help="one part; 'verify' (not in the default run: ~3 minutes more) compares the relabelled "
                             "plan of a 4-layer 8B-wide model on 64 ranks with running every rank")
    opts = parser.parse_args()
    results, entries = {}, []
    work = tempfile.mkdtemp(prefix="bench_simulate_")
    if opts.only in (None, "llama"):
        r = simulate(["--nproc-per-node", "64", "--instance", "trn2.48xlarge",
                      os.path.join(PROGRAMS, "llama_tp_fsdp.py"), "--tp", "8"], os.path.join(work, "llama"))
        results["llama8b_tp8_fsdp8_64_ranks"] = r
        ok = r["returncode"] in (0, 1) and not r["plan"]["errors"]
        entries.append(targets.target("simulate 8B TP8xFSDP8, 64 ranks: wall time", [r["seconds"]] if ok else [],
                                      600, unit="s"))
        entries.append(targets.target("simulate 8B TP8xFSDP8, 64 ranks: peak RSS", [r["peak_rss_bytes"] / GiB]
                                      if ok else [], 8, unit="GiB"))
    if opts.only in (None, "numerics"):
        r = simulate(["--numerics", "--nproc-per-node", "64", "--instance", "trn2.48xlarge",
                      os.path.join(PROGRAMS, "llama_tp_fsdp.py"), *NUMERICS_LLAMA], os.path.join(work, "numerics"))
        results["llama_2_layers_tp8_fsdp8_numerics_64_ranks"] = r
        worst = max(r["plan"]["max_abs_difference"].values(), default=float("inf"))
        entries.append(targets.target("simulate --numerics TP8xFSDP8, 64 ranks: max abs difference from one device",
                                      [worst] if r["returncode"] == 0 else [], 1e-5, unit="abs"))
    if opts.only in (None, "flux"):
        r = simulate(["--nproc-per-node", "4", "--instance", "trn2.3xlarge",
                      os.path.join(PROGRAMS, "flux2_tensor_parallel.py")], os.path.join(work, "flux"))
        results["flux2_4b_tp4_trn2_3xlarge"] = r
        ok = r["returncode"] in (0, 1) and not r["plan"]["errors"]
        entries.append(targets.target("simulate Flux2 4B TP4 (trn2.3xlarge): per-rank peak", [r["plan"]["peak_bytes_max"]
                                      / GiB] if ok else [], r["plan"]["capacity_bytes"] / GiB, unit="GiB"))
    if opts.only in (None, "ddp"):
        r = simulate(["--nproc-per-node", "64", "--instance", "trn2.48xlarge",
                      os.path.join(PROGRAMS, "llama_tp_fsdp.py"), *LLAMA_1B], os.path.join(work, "ddp"))
        results["llama1b_ddp_64_ranks"] = r
        ok = r["returncode"] in (0, 1) and not r["plan"]["errors"]
        entries.append(targets.target("simulate 1B DDP, 64 ranks: wall time", [r["seconds"]] if ok else [], 600,
                                      unit="s"))
    if opts.only == "verify":
        args = ["--nproc-per-node", "64", "--instance", "trn2.48xlarge", os.path.join(PROGRAMS, "llama_tp_fsdp.py"),
                "--tp", "8", "--layers", "4"]
        fast = simulate(args, os.path.join(work, "fast"))
        every = simulate(["--all-ranks", *args], os.path.join(work, "every"))
        with open(os.path.join(work, "fast", "plan.json")) as f, open(os.path.join(work, "every", "plan.json")) as g:
            a, b = json.load(f), json.load(g)
        for rank in a["ranks"]:
            rank.pop("relabelled_from", None)
        same = a["ranks"] == b["ranks"] and a["groups"] == b["groups"]
        results["verify_4_layers_relabelled"], results["verify_4_layers_every_rank"] = fast, every
        print(f"4-layer 8B-wide TP8xFSDP8 on 64 ranks: relabelled {fast['seconds']:.1f} s "
              f"({fast['plan']['script_runs']} runs), every rank {every['seconds']:.1f} s "
              f"({every['plan']['script_runs']} runs); plans {'EQUAL' if same else 'DIFFER'}")
    for name, r in results.items():
        p = r["plan"]
        load = "load average {:.1f} -> {:.1f}".format(*r["load_average_1min"])
        if "ok" in p:
            print(f"{name}: {r['seconds']:.1f} s, peak RSS {r['peak_rss_bytes'] / GiB:.2f} GiB, {load}, numerics "
                  f"{'PASS' if p['ok'] else 'FAIL'}, max |difference| {p['max_abs_difference']}")
            continue
        print(f"{name}: {r['seconds']:.1f} s, peak RSS {r['peak_rss_bytes'] / GiB:.2f} GiB, {load}, "
              f"{p['script_runs']} of {p['world_size']} ranks run, per-rank peak "
              f"{p['peak_bytes_min'] / GiB:.2f}-{p['peak_bytes_max'] / GiB:.2f} GiB of {p['capacity_bytes'] / GiB:.2f}, "
              f"rank 0: {p['rank0_collectives']} collectives {p['rank0_collectives_by_op']}, errors {p['errors'][:1]}")
    print(targets.table(entries))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"results": results, "targets": entries}, f, indent=1)


if __name__ == "__main__":
    main()
