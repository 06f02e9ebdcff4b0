"""Time on Trainium from the plan, checked against AWS's published figures, at full size.

Runs `python -m torch_neuronx.simulate` on the programs of the figures' shapes
(torch_neuronx.simulate.calibration): the Llama-3.3-70B decoder over the 64 ranks of a
trn2.48xlarge (a 10,000-token prefill, then --new-tokens greedy decode steps on a static KV cache)
and the Llama-3.1-8B training step over 32 x trn1.32xlarge (1,024 ranks, TP=32 x DP=32, sequence
parallel, 32 microbatches). Reports each figure's ratio (the plan's no-overlap end against AWS's)
and the 1,024-rank simulation's wall time and peak memory.

--fit re-costs the two plans on a grid of the time model's unpublished constants (no rerun) and
prints the calibration that fits the three figures best: how CALIBRATION was chosen.
Targets (issue 32): each figure within 1.5x; the 1,024-rank plan within 10 minutes on 2 cores."""
import argparse
import json
import os
import tempfile

import common  # noqa: F401  (beside this file; no torch)
import targets
from bench_simulate import GiB, PROGRAMS, run_simulator


def simulate(run, out, extra):
    from torch_neuronx.simulate import calibration

    instance_args, program, flags = calibration.RUNS[run]
    measured, plan = run_simulator([*instance_args, os.path.join(PROGRAMS, program), *flags, *extra], out)
    return {**measured, "plan": plan}


def predictions(plans, cal=None):
    """{figure: value} from the full-size plans, re-costed with ``cal`` when given."""
    from torch_neuronx import simulate as simulator
    from torch_neuronx.simulate import calibration, plan as plans_module

    out = {}
    for run, plan in plans.items():
        if cal is not None:
            instance, nnodes, lnc = simulator.resolve(plan["instance"], plan["nnodes"], plan["nproc_per_node"],
                                                      plan["lnc"])
            layout = plans_module.Layout(instance, lnc, nnodes, plan["nproc_per_node"])
            plan = plans_module.recost(plan, layout, instance.chip.core_memory(lnc), "plan.json", cal).to_json()
        for key in calibration.FIGURES_OF[run]:
            figure = calibration.FIGURES[key]
            out[key] = calibration.value(figure, calibration.step_seconds(figure, plan["time"]["steps"]))
    return out


def main():
    from torch_neuronx.simulate import calibration

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--new-tokens", type=int, default=16,
                        help="decode steps of the 70B program (about 0.7 s of simulation each at full size); "
                             "every one costs the same, on a cache sized for AWS's 10,000 + 1,500 tokens")
    parser.add_argument("--fit", action="store_true", help="also fit the constants to the figures (re-costing)")
    opts = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_step_time_")
    runs = {"decode": simulate("decode", os.path.join(work, "decode"), ["--new-tokens", str(opts.new_tokens)]),
            "train": simulate("train", os.path.join(work, "train"), [])}
    plans = {run: r["plan"] for run, r in runs.items()}
    got = predictions(plans)
    entries = []
    for key, value in got.items():
        figure = calibration.FIGURES[key]
        r = calibration.ratio(figure, value)
        print(f"{figure.name} ({figure.stack}): AWS {figure.value:g} {figure.unit}, the plan {value:.4g} "
              f"{figure.unit}: {r:.3f}x")
        entries.append(targets.target(f"plan vs AWS, {key}: how much slower (above 1) or faster", [max(r, 1 / r)],
                                      1.5))
    for run, r in runs.items():
        print(f"{run}: {r['plan']['world_size']} ranks simulated in {r['seconds']:.0f} s, peak RSS "
              f"{r['peak_rss_bytes'] / GiB:.2f} GiB, load average {r['load_average_1min'][1]:.1f}, exit {r['returncode']}")
    entries.append(targets.target("simulate 1,024 ranks (8B, 32 x trn1.32xlarge): wall time",
                                  [runs["train"]["seconds"]] if runs["train"]["returncode"] == 0 else [], 600,
                                  unit="s"))
    results = {run: {k: v for k, v in r.items() if k != "plan"} | {"time": r["plan"]["time"]}
               for run, r in runs.items()}
    results["predictions"] = got
    if opts.fit:
        cal, ratios = calibration.fit(lambda c: predictions(plans, c))
        print(f"best fit: compute {cal.compute_fraction}, bandwidth {cal.bandwidth_fraction}, NeuronLink step "
              f"{cal.step_latency_s['NeuronLink'] * 1e6:g} us; ratios {ratios}")
        results["fit"] = {"calibration": cal.as_dict(), "ratios": ratios}
    print(targets.table(entries))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"results": results, "targets": entries}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
