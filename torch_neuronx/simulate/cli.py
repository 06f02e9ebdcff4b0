"""``python -m torch_neuronx.simulate``: check a torchrun program's plan for N x M ranks in one process.

``--recost plan.json`` costs a written plan again for another ``--instance`` or ``--lnc`` from
its recorded calls, without running the program.

Exit status: 0 when the plan holds (every rank within its HBM, the ranks agreeing on their
collectives, and under --numerics the values equal to one device's); 1 when it does not (the plan
is still written); 2 for bad input (unknown instance, more ranks per node than cores, no script).
"""
from __future__ import annotations

import argparse
import os
import sys

from torch_neuronx.runtime import outputs
from torch_neuronx.runtime.units import id_ranges

PROG = "python -m torch_neuronx.simulate"


def parse(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run a torchrun program as N x M ranks in one process (fake tensors: no data) and "
                               "write its plan: per-rank memory against HBM, collectives, their time on the "
                               "instance's links; ranks that disagree on their collectives fail.")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="ranks per node (torchrun's)")
    parser.add_argument("--nnodes", type=int, default=None, help="nodes (instances) of the job (default 1)")
    parser.add_argument("--instance", default=None,
                        help="instance type of each node (trn2.48xlarge, trn2.3xlarge, trn3-gen1, ...), N of them "
                             "as '2xtrn2.48xlarge', or an UltraServer (trn2-ultraserver, trn3-gen1-ultraserver, "
                             "trn3-gen2-ultraserver); default trn2.48xlarge (with --recost: the plan's)")
    parser.add_argument("--lnc", type=int, default=None, help="logical NeuronCore config (default: the chip's, 2)")
    parser.add_argument("--numerics", action="store_true",
                        help="run with real values (LocalTensorMode) and compare the program's top-level tensors "
                             "with the same program on one device; for models reduced in depth or width")
    parser.add_argument("--outputs", default=None,
                        help="with --numerics: comma-separated names of the top-level tensors to compare "
                             "(default: every top-level tensor of both runs)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="ranks simulated at once, each in its own forked child (default: 2, or 1 on one CPU)")
    parser.add_argument("--all-ranks", action="store_true",
                        help="run every rank's program, even when rank 0's and the last rank's runs show that "
                             "the program does the same on every rank")
    parser.add_argument("--out", default="neuron_plan", help="directory of plan.json, plan.txt, plan.html")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict")
    parser.add_argument("--recost", metavar="PLAN_JSON", default=None,
                        help="cost a written plan.json again on --instance/--lnc (what-if), from the calls it "
                             "recorded; the program is not run (give no script)")
    parser.add_argument("script", nargs="?", help="the program, as torchrun would be given it")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    return parser, parser.parse_args(argv)


def main(argv=None) -> int:
    parser, args = parse(argv)
    from torch_neuronx import simulate

    if args.recost:
        return recost(args)
    if not args.script:
        print(f"{PROG}: error: give the program to simulate (the script torchrun would run), or --recost "
              "PLAN_JSON to re-cost a written plan", file=sys.stderr)
        return 2
    script = os.path.abspath(args.script)
    if not os.path.isfile(script):
        print(f"{PROG}: error: the script {args.script!r} does not exist (looked for {script}); give the path of "
              "the program torchrun would run", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"{PROG}: error: --jobs {args.jobs}: give 1 or more ranks to simulate at once", file=sys.stderr)
        return 2
    try:
        instance, nnodes, lnc = simulate.resolve(args.instance or "trn2.48xlarge", args.nnodes, args.nproc_per_node,
                                                 args.lnc)
    except simulate.PlanError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2

    if args.numerics:
        from torch_neuronx.simulate import numerics

        compared = [n.strip() for n in args.outputs.split(",") if n.strip()] if args.outputs else None
        result = numerics.run(script, args.args, instance, nnodes, args.nproc_per_node, lnc, compared)
    else:
        progress = None if args.quiet else Progress(args.nproc_per_node * nnodes)
        result = simulate.structure(script, args.args, instance, nnodes, args.nproc_per_node, lnc, progress,
                                    jobs=args.jobs, all_ranks=args.all_ranks)
    outputs.write(result, args.out)
    return report(result, args.out, args.quiet)


class Progress:
    """Ranks done and time elapsed, on standard error, for long simulations."""

    def __init__(self, world: int):
        import time

        self.world, self.done, self.start, self.clock = world, 0, time.perf_counter(), time.perf_counter

    def __call__(self, rank, rec) -> None:
        elapsed = self.clock() - self.start
        if rank is None:
            print(f"simulated {self.done} rank(s) in {elapsed:.0f} s; the other {self.world - self.done} are their "
                  "relabelling: costing the plan", file=sys.stderr, flush=True)
            return
        self.done += 1
        if self.done <= 2 or self.done % 8 == 0 or rec.error or self.done == self.world:
            failed = f" (failed: {rec.error.splitlines()[0][:120]})" if rec.error else ""
            print(f"simulated rank {rank}: {self.done} of {self.world} ranks done, {elapsed:.0f} s elapsed{failed}",
                  file=sys.stderr, flush=True)


def recost(args) -> int:
    import json

    from torch_neuronx import simulate
    from torch_neuronx.simulate import plan as plans, recorded

    try:
        with open(args.recost, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        print(f"{PROG}: error: cannot read the plan {args.recost!r} ({error}): give the plan.json a simulation "
              "wrote", file=sys.stderr)
        return 2
    if args.script:
        print(f"{PROG}: error: --recost runs nothing: give no script (the plan names {recorded.script_named(data)!r})",
              file=sys.stderr)
        return 2
    try:
        old = recorded.read(data, args.recost)
        name = args.instance or old.instance
        same_chip = simulate.resolve(name, None, 1, None)[0].chip.name == old.chip
        lnc = args.lnc if args.lnc is not None else old.lnc if same_chip else None
        counted = "x" in name.split(".")[0] or name in simulate.hardware.SYSTEMS  # the name says how many nodes
        nnodes = None if counted else args.nnodes or old.nnodes
        instance, nnodes, lnc = simulate.resolve(name, nnodes, old.nproc_per_node, lnc)
        layout = plans.Layout(instance, lnc, nnodes, old.nproc_per_node)
        result = plans.recost(old, layout, instance.chip.core_memory(lnc), args.recost)
    except (simulate.PlanError, ValueError, KeyError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    outputs.write(result, args.out)
    return report(result, args.out, args.quiet)


def report(result, out: str, quiet: bool) -> int:

    if not quiet:
        sys.stdout.write(result.text())
    where = os.path.join(out, "plan.json")
    if result.mode == "numerics":
        if not result.numerics.ok:
            print(f"{PROG}: error: the values differ from one device's ({where})", file=sys.stderr)
            return 1
        print(f"numerics match one device; plan in {where}")
        return 0
    failed = [r for r in result.ranks if r.error is not None]
    if failed:
        r = failed[0]
        alike = [x.rank for x in failed if x.error.line == r.error.line]
        ranks = f"ranks {id_ranges(alike)}" if len(alike) > 1 else f"rank {r.rank}"
        print(f"{PROG}: error: the program failed on {ranks} at {r.error.line or 'an unknown line'}: "
              f"{r.error.message}", file=sys.stderr)
        return 1
    if result.divergence:
        print(f"{PROG}: error: {result.divergence.message}", file=sys.stderr)
        return 1
    if result.over_capacity:
        o = result.over_capacity[0]
        print(f"{PROG}: error: {len(result.over_capacity)} rank(s) exceed their core's HBM; first rank "
              f"{o.rank}, crossed at {o.line or o.site} ({where})", file=sys.stderr)
        return 1
    print(f"plan holds: {result.world_size} ranks within HBM, collectives agree; plan in {where}")
    return 0
