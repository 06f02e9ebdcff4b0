"""Trainium readiness: what would break or be slow on a real NeuronCore, from the actual run.

    torch_neuronx.diagnostics.start()          # or TORCH_NEURONX_REPORT=1, or python -m torch_neuronx.run
    with torch_neuronx.diagnostics.phase("denoise"):
        ...
    print(torch_neuronx.report())             # a Report dataclass; prints as a table
"""
from __future__ import annotations

import atexit
import os
import sys
import warnings

from torch_neuronx.diagnostics import report as _report
from torch_neuronx.diagnostics.gate import FAIL_ON_ENV
from torch_neuronx.diagnostics.observer import phase, record_error, start, stop
from torch_neuronx.diagnostics.op_tracking import (clear_op_tracking, get_executed_ops, get_fallback_ops,
                                                 get_op_counts)
from torch_neuronx.diagnostics.report import Mark, Report, findings_since, mark
from torch_neuronx.diagnostics.rows import FindingRow
from torch_neuronx.runtime import env_flag

REPORT_ENV = "TORCH_NEURONX_REPORT"
PROFILE_ENV = "TORCH_NEURONX_REPORT_PROFILE"

__all__ = ["Mark", "Report", "clear_op_tracking", "findings_since", "get_executed_ops", "get_fallback_ops",
           "get_op_counts", "get_op_signatures", "mark", "phase", "record_error", "report", "start", "stop", "write"]


def report(profile=None) -> Report:
    """What was collected so far, with findings and an estimate on ``profile`` (default: the emulated
    instance's chip and LNC; or "Trainium2:2", "Trainium3:1", a TrainiumProfile)."""
    return _report.build(profile or os.environ.get(PROFILE_ENV) or None)


def get_op_signatures() -> dict[str, int]:
    """Each distinct eager call seen while collecting, 'op(shapes and dtypes)' -> calls. Each is one
    NEFF compile in TorchNeuron's eager mode."""
    return {f"{s.op}({', '.join(s.inputs)})": s.calls for s in report().signatures}


FORMATS = ("txt", "json", "html", "sarif")
DEFAULT_FORMATS = ("txt", "json", "html")


def write(result: Report, directory: str, formats=DEFAULT_FORMATS, exit_status: int | None = None,
          new_findings: list[FindingRow] | None = None) -> dict[str, str]:
    """Write ``result`` into ``directory`` as report.<format> for each of ``formats`` (txt, json, html,
    sarif); returns the paths by format. The SARIF log records ``exit_status`` (the run's) and, given
    ``new_findings`` (those a baseline does not hold), which findings are new."""
    from torch_neuronx.diagnostics import places, sarif
    from torch_neuronx.runtime import outputs

    return outputs.write(result, directory, formats, more={
        "sarif": lambda: sarif.render(result.findings, places.repository_root(), exit_status, new_findings)})


def _print_at_exit() -> None:
    import torch

    # The error the program stopped on (Python keeps it as sys.last_value), if Trainium raises it too.
    stopped = getattr(sys, "last_value", None) is not None and record_error(sys.last_value)
    if not torch.neuron.is_initialized() and not stopped:  # e.g. torchrun's own process, which only launches
        print(f"torch_neuronx: {REPORT_ENV}: neuron was not used in this process (pid {os.getpid()}), "
              "nothing to report", file=sys.stderr)
        return
    try:
        result = report()
        sys.stdout.flush()  # the program's output first, then the report
        print(result, file=sys.stderr)
        if os.environ.get(FAIL_ON_ENV):  # at exit the status is the program's: there is no gate here
            print(f"torch_neuronx: {FAIL_ON_ENV} is read by python -m torch_neuronx.run and pytest "
                  f"--neuron-readiness; {REPORT_ENV}=1 keeps the program's exit status", file=sys.stderr)
    except Exception as error:  # noqa: BLE001 - never turn a finished program into a failed one
        print(f"torch_neuronx: the report failed: {type(error).__name__}: {error}", file=sys.stderr)


def enable_from_env() -> None:
    """TORCH_NEURONX_REPORT=1: collect from import on, print the report at exit."""
    try:
        enabled = env_flag(REPORT_ENV, default=False)
    except ValueError as error:  # read at import (of torch, under autoload): warn, never fail the import
        warnings.warn(f"{error}; no Trainium readiness report will be printed", RuntimeWarning, stacklevel=2)
        return
    if enabled:
        start()
        atexit.register(_print_at_exit)
