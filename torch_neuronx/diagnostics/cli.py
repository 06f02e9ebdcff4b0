"""Run a script with Trainium-readiness diagnostics, then write the report.

    python -m torch_neuronx.run [--output-dir DIR] [--profile CHIP:LNC] script.py [args...]
    python -m torch_neuronx.run [options] -m package.module [args...]

Writes DIR/report.txt, report.json and report.html (default DIR: ./neuron_report) and prints the
text report. The script's exit status is kept.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys

from torch_neuronx import diagnostics
from torch_neuronx.diagnostics import cost_model


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torch_neuronx.run", description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [--output-dir DIR] [--profile CHIP:LNC] "
                                           "(script.py | -m module) [args...]")
    parser.add_argument("--output-dir", default="neuron_report", help="where to write the report (default: %(default)s)")
    parser.add_argument("--profile", default=None,
                        help="the Trainium to estimate for, CHIP:LNC (Trainium2:2, Trainium3:1, ...); default: "
                             "the emulated instance")
    parser.add_argument("-m", dest="module", default=None, help="run a module as a script, like python -m")
    # Everything from the script (or -m's module) on belongs to the program, as with python itself.
    ours, target, rest = [], None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--output-dir", "--profile") and i + 1 < len(argv):
            ours += argv[i:i + 2]
            i += 2
        elif arg == "-m" and i + 1 < len(argv):
            ours += argv[i:i + 2]
            rest = argv[i + 2:]
            break
        elif arg.startswith("-"):
            ours.append(arg)  # --output-dir=DIR, -h, or a mistake argparse will name
            i += 1
        else:
            target, rest = arg, argv[i + 1:]
            break
    options = parser.parse_args(ours)
    options.script, options.args = target, rest
    if options.module is None and options.script is None:
        parser.error("name a script to run (or -m module)")
    if options.script is not None and not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    if options.profile is not None:
        try:
            cost_model.parse_profile(options.profile)
        except ValueError as error:
            parser.error(f"--profile {options.profile}: {error}")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    diagnostics.start()
    status = 0
    target = options.module or options.script
    sys.argv = [target, *options.args]
    try:
        if options.module is not None:
            runpy.run_module(options.module, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
            runpy.run_path(options.script, run_name="__main__")
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    finally:
        diagnostics.stop()
        result = diagnostics.report(options.profile)
        paths = diagnostics.write(result, options.output_dir)
        sys.stdout.flush()  # the program's output first, then the report
        print(result, file=sys.stderr)
        print(f"\nReport written to {paths['txt']}, {paths['json']} and {paths['html']}", file=sys.stderr)
    return status
