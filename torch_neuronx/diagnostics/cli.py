"""Run a script with Trainium-readiness diagnostics, then write the report.

    python -m torch_neuronx.run [--output-dir DIR] [--profile CHIP:LNC] [--format txt,json,html,sarif]
                                [--fail-on SEVERITY] [--baseline REPORT] script.py [args...]
    python -m torch_neuronx.run [options] -m package.module [args...]

Writes DIR/report.txt, report.json and report.html (default DIR: ./neuron_report; --format picks the
files, sarif among them) and prints the text report. The script's exit status is kept; with
--fail-on (or TORCH_NEURONX_REPORT_FAIL_ON), a finding of that severity or worse that the baseline
does not hold makes a script that succeeded exit with status 3. Under GitHub Actions
(GITHUB_ACTIONS=true) each finding is also printed as a workflow annotation.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys

from torch_neuronx import diagnostics
from torch_neuronx.diagnostics import gate, sarif
from torch_neuronx.trainium import cost_model

VALUED = ("--output-dir", "--profile", "--format", "--fail-on", "--baseline")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m torch_neuronx.run", description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [--output-dir DIR] [--profile CHIP:LNC] [--format LIST] "
                                           "[--fail-on SEVERITY] [--baseline REPORT] (script.py | -m module) "
                                           "[args...]")
    parser.add_argument("--output-dir", default="neuron_report", help="where to write the report (default: %(default)s)")
    parser.add_argument("--profile", default=None,
                        help="the Trainium to estimate for, CHIP:LNC (Trainium2:2, Trainium3:1, ...); default: "
                             "the emulated instance")
    parser.add_argument("--format", default=",".join(diagnostics.DEFAULT_FORMATS),
                        help=f"the report files to write, comma-separated, of {', '.join(diagnostics.FORMATS)} "
                             "(default: %(default)s)")
    parser.add_argument("--fail-on", default=None, metavar="SEVERITY",
                        help=f"exit {gate.EXIT_FINDINGS} when a finding of this severity or worse is found: "
                             f"{', '.join(gate.ORDER)} or {gate.NEVER} (default: ${gate.FAIL_ON_ENV}, else never)")
    parser.add_argument("--baseline", default=None, metavar="REPORT",
                        help="an earlier report.json (or report.sarif) whose findings are accepted: only new "
                             "ones fail the gate")
    parser.add_argument("-m", dest="module", default=None, help="run a module as a script, like python -m")
    return parser


def _split(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """(our options, the script, its arguments): everything from the script (or -m's module) on
    belongs to the program, as with python itself."""
    ours, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in VALUED and i + 1 < len(argv):
            ours += argv[i:i + 2]
            i += 2
        elif arg == "-m" and i + 1 < len(argv):
            return ours + argv[i:i + 2], None, argv[i + 2:]
        elif arg.startswith("-"):
            ours.append(arg)  # --output-dir=DIR, -h, or a mistake argparse will name
            i += 1
        else:
            return ours, arg, argv[i + 1:]
    return ours, None, []


def parse(argv: list[str]) -> argparse.Namespace:
    """The options, checked before the script runs: a mistake costs nothing of its run."""
    parser = _parser()
    ours, target, rest = _split(argv)
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
    options.formats = tuple(dict.fromkeys(f.strip().lower() for f in options.format.split(",") if f.strip()))
    unknown = [f for f in options.formats if f not in diagnostics.FORMATS]
    if unknown or not options.formats:
        parser.error(f"--format {options.format}: use one or more of {', '.join(diagnostics.FORMATS)}, "
                     "comma-separated")
    try:
        options.severity = (gate.threshold(options.fail_on) if options.fail_on is not None
                            else gate.threshold_from_env())
        options.baseline_findings = gate.Baseline.load(options.baseline) if options.baseline else None
    except ValueError as error:
        parser.error(str(error))
    return options


def _run(options: argparse.Namespace) -> int:
    """Run the script (or module) as python would; its exit status."""
    sys.argv = [options.module or options.script, *options.args]
    try:
        if options.module is not None:
            runpy.run_module(options.module, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
            runpy.run_path(options.script, run_name="__main__")
    except SystemExit as exit_:
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def _finish(options: argparse.Namespace, status: int) -> int:
    """Report, judge and write; the exit status: the script's failure first, then the gate's."""
    diagnostics.stop()
    result = diagnostics.report(options.profile)
    baseline = options.baseline_findings
    new = baseline.new(result.findings) if baseline is not None else None
    verdict = gate.judge(result.findings, options.severity, baseline) if options.severity else None
    final = status if status != 0 or verdict is None or verdict.passed else gate.EXIT_FINDINGS
    paths = diagnostics.write(result, options.output_dir, options.formats, exit_status=final, new_findings=new)
    sys.stdout.flush()  # the program's output first, then the report
    print(result, file=sys.stderr)
    names = [paths[f] for f in options.formats]
    print(f"\nReport written to {', '.join(names[:-1]) + ' and ' if len(names) > 1 else ''}{names[-1]}",
          file=sys.stderr)
    if os.environ.get("GITHUB_ACTIONS") == "true":  # workflow commands are read from stdout
        print("\n".join(sarif.annotations(new if new is not None else result.findings)), flush=True)
    if verdict is not None:
        print(verdict.text(), file=sys.stderr)
    return final


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    diagnostics.start()
    status = 1  # the script raised (its traceback follows the report, as python prints it at exit)
    try:
        status = _run(options)
    except BaseException as error:
        diagnostics.record_error(error)  # a finding at its line, when Trainium raises it too
        raise
    finally:
        status = _finish(options, status)
    return status
