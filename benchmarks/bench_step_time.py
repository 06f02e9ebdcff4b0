"""Time on Trainium from the plan, against AWS's published rows, at full size; and a real-length decode.

Runs `python -m torch_neuronx.simulate` on the program of each run of
torch_neuronx/trainium/calibration.py (RUNS) at full size and reads each published row (ROWS) off
its plan: with the constants in place, and held out (the constants fitted to the other rows,
torch_neuronx/simulate/fit.py). Prints each row's ratios, the worst and the median held-out ratio,
and the constants fitted to every row (rounded: what CALIBRATION should state) with the range of the
held-out ratios (its interval).

--decode plans the Llama-3.3-70B decoder over the 64 ranks of a trn2.48xlarge with a 10,000-token
prefill and 1,500 decode steps (each compiled graph call after the first replays its record), and the
same program with 16 decode steps, and compares their time per token.

Targets (issue 49): every row within 1.5x held out; the 1,500-step plan within 3 minutes on the
2-core machine, its time per token equal to the 16-step plan's. --plans DIR reads plans written
before (DIR/<run>/plan.json) instead of running the programs again."""
import argparse
import json
import os
import statistics
import tempfile

import common  # noqa: F401  (beside this file; no torch)
import targets
from bench_simulate import GiB, PROGRAMS, run_simulator

DECODE_STEPS = 1500


def simulate_runs(out: str, reuse: bool) -> tuple[dict, dict]:
    """({run: its plan}, {run: the simulation's measurements}) of every run at full size."""
    from torch_neuronx.trainium import calibration

    plans, measured = {}, {}
    for name, run in calibration.RUNS.items():
        path = os.path.join(out, name)
        if reuse and os.path.exists(os.path.join(path, "plan.json")):
            with open(os.path.join(path, "plan.json")) as f:
                plans[name] = json.load(f)
            continue
        measured[name], plans[name] = run_simulator(
            [*run.simulator, os.path.join(PROGRAMS, run.program), *run.flags], path)
        print(f"{name}: {plans[name]['world_size']} ranks in {measured[name]['seconds']:.0f} s, peak RSS "
              f"{measured[name]['peak_rss_bytes'] / GiB:.2f} GiB, load {measured[name]['load_average_1min'][1]:.1f}",
              flush=True)
    return plans, measured


def evaluate(plans: dict) -> dict:
    """Each row's prediction with the constants in place and held out, and the fit to every row."""
    from torch_neuronx.trainium import time_model
    from torch_neuronx.simulate import fit

    samples = fit.samples({run: (fit.rank0(plan), fit.layout_of(plan)) for run, plan in plans.items()})
    held = fit.leave_one_out(samples)
    fitted = fit.rounded(fit.fit(samples))
    rows = {s.key: {"published": s.row.value, "unit": s.row.unit, "predicted": s.predicted(time_model.CALIBRATION),
                    "ratio": s.ratio(time_model.CALIBRATION), "held_out": held[s.key],
                    "ratio_fitted": s.ratio(fitted)} for s in samples}
    spread = [max(r, 1 / r) for r in held.values()]
    return {"rows": rows, "worst": max(spread), "median": statistics.median(spread),
            "held_out_range": [min(held.values()), max(held.values())],
            "fitted": {name: read(fitted) for name, read, _ in fit.FITTED}}


def report_rows(result: dict) -> list:
    print(f"{'row':<18} {'AWS':>12} {'the plan':>12} {'ratio':>7} {'held out':>9}")
    for key, r in result["rows"].items():
        unit = " s" if r["unit"] == "s" else " seq/s"
        print(f"{key:<18} {r['published']:>10.4g}{unit:<2} {r['predicted']:>10.4g}{unit:<2} {r['ratio']:>6.3f}x "
              f"{r['held_out']:>8.3f}x")
    print(f"held out: worst {result['worst']:.3f}x, median {result['median']:.3f}x, range "
          f"{result['held_out_range'][0]:.3f}x-{result['held_out_range'][1]:.3f}x; fitted to every row: "
          f"{result['fitted']}")
    return [targets.target(f"held-out prediction vs AWS, {key}: slower (above 1) or faster",
                           [max(r["held_out"], 1 / r["held_out"])], 1.5) for key, r in result["rows"].items()]


def decode(out: str, steps: int) -> dict:
    """The 70B TP=64 decode program with a 10,000-token prefill and ``steps`` decode steps."""
    from torch_neuronx.trainium import calibration

    run = calibration.RUNS["70b-trn2"]
    flags = ["--prompt", "10000", "--new-tokens", str(steps + 1), "--max-length", str(10000 + DECODE_STEPS + 1)]
    measured, plan = run_simulator([*run.simulator, os.path.join(PROGRAMS, run.program), *calibration.LLAMA_70B,
                                    *flags], os.path.join(out, f"decode{steps}"))
    row = plan["time"]["steps"]["decode"]
    print(f"decode x {row['count']}: planned in {measured['seconds']:.0f} s (CPU {measured['cpu_seconds']:.0f} s over "
          f"its processes; load {measured['load_average_1min']}), "
          f"peak RSS {measured['peak_rss_bytes'] / GiB:.2f} GiB, {row['per_token_seconds'] * 1e3:.4f} ms per token",
          flush=True)
    return {**measured, "per_token_seconds": row["per_token_seconds"], "count": row["count"]}


def decode_targets(long: dict, short: dict) -> list:
    same = long["per_token_seconds"] / short["per_token_seconds"]
    print(f"per token: {DECODE_STEPS} steps {long['per_token_seconds']!r} s, 16 steps {short['per_token_seconds']!r} s"
          f" (ratio {same!r})")
    return [targets.target(f"plan the 70B decode, {DECODE_STEPS} steps: wall time",
                           [long["seconds"]] if long["returncode"] == 0 else [], 180, unit="s"),
            targets.target(f"per-token time, {DECODE_STEPS} steps / 16 steps: off by", [abs(same - 1)], 1e-9)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--plans", default=None, help="a directory of the runs' plans: read them where they exist")
    parser.add_argument("--decode", action="store_true", help=f"also plan the 70B decode at {DECODE_STEPS} steps")
    parser.add_argument("--decode-only", action="store_true", help="only the decode plans")
    opts = parser.parse_args()
    out = opts.plans or tempfile.mkdtemp(prefix="bench_step_time_")
    results, entries = {}, []
    if not opts.decode_only:
        plans, results["runs"] = simulate_runs(out, reuse=opts.plans is not None)
        results["rows"] = evaluate(plans)
        entries += report_rows(results["rows"])
    if opts.decode or opts.decode_only:
        results["decode"] = {steps: decode(out, steps) for steps in (DECODE_STEPS, 16)}
        entries += decode_targets(results["decode"][DECODE_STEPS], results["decode"][16])
    print(targets.table(entries))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"results": results, "targets": entries}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
