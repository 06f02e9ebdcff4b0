"""``python -m torch_neuronx.simulate``: check a torchrun program's plan for N x M ranks in one process.

Exit status: 0 when the plan holds (every rank within its HBM, the ranks agreeing on their
collectives, and under --numerics the values equal to one device's); 1 when it does not (the plan
is still written); 2 for bad input (unknown instance, more ranks per node than cores, no script).
"""
from __future__ import annotations

import argparse
import os
import sys

PROG = "python -m torch_neuronx.simulate"


def parse(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run a torchrun program as N x M ranks in one process (fake tensors: no data) and "
                               "write its plan: per-rank memory against HBM, collectives, their time on the "
                               "instance's links; ranks that disagree on their collectives fail.")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="ranks per node (torchrun's)")
    parser.add_argument("--nnodes", type=int, default=None, help="nodes (instances) of the job (default 1)")
    parser.add_argument("--instance", default="trn2.48xlarge",
                        help="instance type of each node (trn2.48xlarge, trn2.3xlarge, trn3-gen1, ...), N of them "
                             "as '2xtrn2.48xlarge', or an UltraServer (trn2-ultraserver, trn3-gen1-ultraserver, "
                             "trn3-gen2-ultraserver); default trn2.48xlarge")
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
    parser.add_argument("script", help="the program, as torchrun would be given it")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    return parser, parser.parse_args(argv)


def main(argv=None) -> int:
    parser, args = parse(argv)
    from torch_neuronx import simulate

    script = os.path.abspath(args.script)
    if not os.path.isfile(script):
        print(f"{PROG}: error: the script {args.script!r} does not exist (looked for {script}); give the path of "
              "the program torchrun would run", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"{PROG}: error: --jobs {args.jobs}: give 1 or more ranks to simulate at once", file=sys.stderr)
        return 2
    try:
        instance, nnodes, lnc = simulate.resolve(args.instance, args.nnodes, args.nproc_per_node, args.lnc)
    except simulate.PlanError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    from torch_neuronx.simulate import plan as plans

    if args.numerics:
        from torch_neuronx.simulate import numerics

        outputs = [n.strip() for n in args.outputs.split(",") if n.strip()] if args.outputs else None
        result = numerics.run(script, args.args, instance, nnodes, args.nproc_per_node, lnc, outputs)
    else:
        def progress(rank, rec):
            if not args.quiet and (rank % 8 == 7 or rec.error or rank == 0):
                print(f"simulated rank {rank}", file=sys.stderr, flush=True)

        result = simulate.structure(script, args.args, instance, nnodes, args.nproc_per_node, lnc, progress,
                                    jobs=args.jobs, all_ranks=args.all_ranks)
    plans.write(result, args.out)
    return report(result, args.out, args.quiet)


def report(result: dict, out: str, quiet: bool) -> int:
    from torch_neuronx.simulate import plan as plans

    if not quiet:
        sys.stdout.write(plans.text(result))
    where = os.path.join(out, "plan.json")
    if result.get("mode") == "numerics":
        if not result["numerics"]["ok"]:
            print(f"{PROG}: error: the values differ from one device's ({where})", file=sys.stderr)
            return 1
        print(f"numerics match one device; plan in {where}")
        return 0
    failed = [r for r in result["ranks"] if "error" in r]
    if failed:
        r = failed[0]
        print(f"{PROG}: error: the program failed on rank {r['rank']} at {r['error']['line'] or 'an unknown line'}: "
              f"{r['error']['message']}", file=sys.stderr)
        return 1
    if result["divergence"]:
        print(f"{PROG}: error: {result['divergence']['message']}", file=sys.stderr)
        return 1
    if result["over_capacity"]:
        o = result["over_capacity"][0]
        print(f"{PROG}: error: {len(result['over_capacity'])} rank(s) exceed their core's HBM; first rank "
              f"{o['rank']}, crossed at {o['line'] or o['site']} ({where})", file=sys.stderr)
        return 1
    print(f"plan holds: {result['world_size']} ranks within HBM, collectives agree; plan in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
