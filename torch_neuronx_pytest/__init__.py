"""pytest --neuron-readiness[=SEVERITY]: each test observed for what would go wrong on Trainium.

Registered by entry point (pytest11), so installing torch-neuronx-cpu is enough. Without the option
the plugin only declares it: no import of torch, no hook around a test. With it, the readiness
diagnostics (torch_neuronx.diagnostics) collect from the first test's setup on, and each test's
setup, call and teardown get the findings made while they ran:

- on the test's report: a "neuron readiness" section (shown with the test's output) and one
  ``neuron_readiness`` user property per finding (JUnit XML writes them as <property>);
- a phase that passed, with a finding of SEVERITY or worse, fails, with the finding as its failure;
- a summary table at the end: each place found, its severity and kind, and the tests it was in.

SEVERITY is would-fail (the default), computes-differently, runs-slowly, near-limit or none (observe,
fail nothing); a bare --neuron-readiness takes TORCH_NEURONX_REPORT_FAIL_ON when set. Reports carry
the findings as data, so the summary works under pytest-xdist too.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import pytest

OPTION = "--neuron-readiness"
DEST = "neuron_readiness"
# torch_neuronx.diagnostics.gate's names, repeated so that this module imports nothing heavy: a
# test checks that they agree.
FAIL_ON_ENV = "TORCH_NEURONX_REPORT_FAIL_ON"
SEVERITIES = ("would-fail", "computes-differently", "runs-slowly", "near-limit")
NEVER = "none"
DEFAULT = "would-fail"
PROPERTY = "neuron_readiness"  # the user property (and JUnit <property>) of each finding
REPORT_ATTRIBUTE = "neuron_readiness"  # the findings on a TestReport, as data (xdist sends it on)
SECTION = "neuron readiness"


class Place(NamedTuple):
    """The parts of a report row (diagnostics.rows.FindingRow) a test report carries, as a dict of
    strings and numbers (xdist serialises them): :meth:`of` a row, ``_asdict()`` to carry it, and
    ``Place(**carried)`` where a report is read."""

    severity: str
    kind: str
    path: str | None
    line: int | None
    code: str
    site: str
    fingerprint: str
    meaning: str
    fix: str
    count: int

    @classmethod
    def of(cls, row) -> Place:
        return cls(*(getattr(row, key) for key in cls._fields))


ROW_KEYS = Place._fields


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("neuron-readiness", "Trainium readiness (torch-neuronx-cpu)")
    group.addoption(OPTION, dest=DEST, nargs="?", const="", default=None, metavar="SEVERITY",
                    help=f"observe each test on neuron and fail those with a finding of SEVERITY or worse: "
                         f"{', '.join(SEVERITIES)} or {NEVER} (default: ${FAIL_ON_ENV}, else {DEFAULT})")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    """``pytest --neuron-readiness tests/``: the path is not the option's value. The arguments are
    mended in place (pytest parses this same list next), and so is the early parse."""
    for i, arg in enumerate(args[:-1]):
        if arg == "--":
            break
        following = args[i + 1]
        if arg == OPTION and following.lower() not in (*SEVERITIES, NEVER) and not following.startswith("-"):
            args[i] = OPTION + "="
            known = early_config.known_args_namespace
            if getattr(known, DEST, None) == following:
                setattr(known, DEST, "")
                known.file_or_dir = [following, *(known.file_or_dir or [])]


def _severity(value: str) -> str | None:
    """The severity to fail on (None: fail nothing), or a usage error naming the accepted ones. Asked
    for, the plugin observes: importing the diagnostics (and torch) is due now."""
    from torch_neuronx.diagnostics import gate

    source = OPTION
    if value == "":
        value, source = os.environ.get(FAIL_ON_ENV, "") or DEFAULT, FAIL_ON_ENV
    try:
        return gate.threshold(value, source)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption(DEST)
    if value is None:
        return
    config.pluginmanager.register(ReadinessObserver(_severity(value)), "neuron-readiness-observer")


def _place(row: Place) -> str:
    return f"{row.path}:{row.line}" if row.path else row.site


def _finding_line(row: Place) -> str:
    return f"{row.severity} [{row.kind}] {_place(row)}  {row.code or ''}".rstrip()


def _explained(row: Place) -> str:
    return f"{_finding_line(row)}\n    {row.meaning}\n    fix: {row.fix}"


class ReadinessObserver:
    """Marks where each test phase starts and hands the findings made since to the phase's report.
    The collection starts at the first setup, in the process that runs tests (never in xdist's
    controller, which runs none)."""

    def __init__(self, severity: str | None) -> None:
        self.severity = severity
        self.diagnostics = None  # torch_neuronx.diagnostics, imported when the first test starts
        self.since = None  # the mark the running phase's findings are counted from
        self.seen: dict[str, tuple[Place, list[str]]] = {}  # fingerprint -> the row and the tests it was in
        self.failed: list[str] = []  # node ids of the phases failed for their findings

    def _failing(self, rows: list[Place]) -> list[Place]:
        """The rows at or above the severity the run fails on."""
        from torch_neuronx.diagnostics import gate

        return gate.at_or_worse(rows, self.severity) if self.severity else []

    def _mark(self) -> None:
        if self.diagnostics is None:
            from torch_neuronx import diagnostics

            diagnostics.start()
            self.diagnostics = diagnostics
        self.since = self.diagnostics.mark()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._mark()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if self.since is None:
            return
        rows = [Place.of(row) for row in self.diagnostics.findings_since(self.since)]
        self._mark()  # the next phase counts from here
        if not rows:
            return
        setattr(report, REPORT_ATTRIBUTE, [row._asdict() for row in rows])
        properties = [(PROPERTY, _finding_line(row)) for row in rows]
        # On the item too, as record_property does: JUnit XML writes the properties of the last report.
        item.user_properties.extend(properties)
        report.user_properties.extend(properties)
        report.sections.append((f"{SECTION} ({call.when})", "\n".join(map(_explained, rows))))
        failing = self._failing(rows)
        if failing and report.passed:
            report.outcome = "failed"
            report.longrepr = "\n".join(
                [f"neuron readiness: {len(failing)} finding{'s' if len(failing) > 1 else ''} of "
                 f"{self.severity} or worse in this test's {call.when} (pytest {OPTION}={self.severity}):"]
                + ["  " + _explained(row) for row in failing])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Gathered from every report (under xdist, from the workers'), for the summary."""
        rows = [Place(**carried) for carried in getattr(report, REPORT_ATTRIBUTE, None) or []]
        for row in rows:
            _, tests = self.seen.setdefault(row.fingerprint, (row, []))
            if report.nodeid not in tests:
                tests.append(report.nodeid)
        if report.failed and self._failing(rows):
            self.failed.append(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", SECTION)
        gate = f"fail on {self.severity}" if self.severity else "observe only"
        if not self.seen:
            write(f"No findings ({gate}): nothing in these tests would fail, compute differently or run "
                  "slowly on Trainium.")
            return
        tests = {test for _, names in self.seen.values() for test in names}
        write(f"{len(self.seen)} place{'s' if len(self.seen) > 1 else ''} found in {len(tests)} "
              f"test{'s' if len(tests) > 1 else ''} ({gate}; {len(set(self.failed))} failed for it):")
        order = {severity: i for i, severity in enumerate(SEVERITIES)}
        entries = sorted(self.seen.values(), key=lambda e: (order.get(e[0].severity, 9), _place(e[0])))
        width = max(len(row.severity) for row, _ in entries)
        kind_width = max(len(row.kind) for row, _ in entries)
        for row, names in entries:
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            write(f"  {row.severity:<{width}}  {row.kind:<{kind_width}}  {_place(row)}  "
                  f"{row.code or ''}".rstrip())
            write(f"  {'':<{width}}  {'':<{kind_width}}  in {names[0]}{more}")
