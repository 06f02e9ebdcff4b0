"""The readiness report as a CI gate: which findings fail the job, and which a baseline accepts.

``--fail-on SEVERITY`` (or TORCH_NEURONX_REPORT_FAIL_ON) fails on a finding of that severity or a
worse one. A baseline is an earlier report.json (or report.sarif): the findings it holds are
accepted, so a project adopts the gate on existing code and only new findings fail. Findings are
matched by kind, file and code line (places.fingerprint), so editing lines above one keeps it matched.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

from torch_neuronx.diagnostics import places
from torch_neuronx.diagnostics.findings import SEVERITIES
from torch_neuronx.diagnostics.rows import FindingRow
from torch_neuronx.runtime.rows import Row

FAIL_ON_ENV = "TORCH_NEURONX_REPORT_FAIL_ON"
EXIT_FINDINGS = 3  # the exit status when the gate fails (the script's own failure keeps its status)
NEVER = "none"
ORDER = list(SEVERITIES)  # worst first
SARIF_FINGERPRINT = "neuronReadiness/v1"


def threshold(value: str | None, source: str = "--fail-on") -> str | None:
    """The severity to fail on, from an option or the variable (None: never fail)."""
    value = (value or "").strip().lower()
    if value in ("", NEVER):
        return None
    if value not in SEVERITIES:
        raise ValueError(f"{source}={value!r} is not a severity: use one of {', '.join(ORDER)} (each fails on "
                         f"that severity and worse ones), or {NEVER}")
    return value


def threshold_from_env() -> str | None:
    return threshold(os.environ.get(FAIL_ON_ENV), FAIL_ON_ENV)


def at_or_worse(rows: list[FindingRow], severity: str) -> list[FindingRow]:
    """The findings rows (or any rows with a ``severity``) of ``severity`` or a worse one."""
    limit = ORDER.index(severity)
    return [row for row in rows if row.severity in SEVERITIES and ORDER.index(row.severity) <= limit]


@dataclass(frozen=True)
class WrittenFinding(Row):
    """What a baseline reads of a findings row of a written report.json: reports written before
    fingerprints existed lack the later keys, and get their fingerprint made here."""

    kind: str
    site: str = ""
    file: str | None = None
    code: str = ""
    path: str | None = None
    fingerprint: str = ""

    def key(self) -> str:
        """Its fingerprint, as the rows of this version's reports carry it."""
        if self.fingerprint:
            return self.fingerprint
        path = self.path or (places.relative_path(self.file, places.repository_root()) if self.file else None)
        return places.fingerprint(self.kind, path, self.code, self.site)


class BaselineError(ValueError):
    pass


@dataclass
class Baseline:
    source: str
    accepted: Counter = field(default_factory=Counter)  # fingerprint -> findings accepted

    @classmethod
    def load(cls, path: str) -> Baseline:
        """Read a report.json or a SARIF file; a file that is neither is refused, naming the fix."""
        fix = "pass a report.json (or report.sarif) that python -m torch_neuronx.run wrote, or drop --baseline"
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as error:
            raise BaselineError(f"baseline {path}: cannot be read ({error.strerror}): {fix}") from None
        except ValueError as error:
            raise BaselineError(f"baseline {path}: not JSON ({error}): {fix}") from None
        baseline = cls(os.path.abspath(path))
        try:
            if isinstance(data, dict) and isinstance(data.get("runs"), list):
                for run in data["runs"]:
                    for result in run.get("results", []):
                        baseline.accepted[result["partialFingerprints"][SARIF_FINGERPRINT]] += 1
            elif isinstance(data, dict) and isinstance(data.get("findings"), list):
                for row in data["findings"]:
                    baseline.accepted[WrittenFinding.from_dict(row).key()] += 1
            else:
                raise KeyError("findings")
        except (KeyError, TypeError, AttributeError) as error:
            raise BaselineError(f"baseline {path}: not a readiness report (no {error} where findings are): "
                                f"{fix}") from None
        return baseline

    def new(self, rows: list[FindingRow]) -> list[FindingRow]:
        """The rows the baseline does not hold: each baseline entry accepts one finding, so a second
        copy of an accepted line is new."""
        left = Counter(self.accepted)
        fresh = []
        for row in rows:
            key = row.fingerprint
            if left[key] > 0:
                left[key] -= 1
            else:
                fresh.append(row)
        return fresh


# What a gate at each severity fails on, in words.
FAILS_ON = {
    "would-fail": "would fail on Trainium",
    "computes-differently": "would fail or compute differently on Trainium",
    "runs-slowly": "would fail, compute differently or run slowly on Trainium",
    "near-limit": "would fail, compute differently, run slowly or be near a limit on Trainium",
}


@dataclass
class Verdict:
    severity: str
    failing: list[FindingRow]  # rows that fail the gate
    accepted: int  # rows at or above the severity that the baseline holds
    baseline: str | None

    @property
    def passed(self) -> bool:
        return not self.failing

    def text(self) -> str:
        """The gate's lines for stderr: passed or failed, with each failing place."""
        what = FAILS_ON[self.severity]
        accepted = f"; {self.accepted} accepted by the baseline {self.baseline}" if self.baseline else ""
        if self.passed:
            return f"Readiness gate (fail on {self.severity}): passed, nothing new that {what}{accepted}."
        places_ = len({row.site for row in self.failing})
        lines = [f"Readiness gate (fail on {self.severity}): FAILED, exit status {EXIT_FINDINGS}: "
                 f"{places_} {'place' if places_ == 1 else 'places'} {what}"
                 + (" (new since the baseline)" if self.baseline else "") + accepted + "."]
        for row in self.failing:
            where = f"{row.path}:{row.line}" if row.path else row.site
            lines.append(f"  {where}  [{row.kind}]  {row.code}".rstrip())
        if not self.baseline:
            lines.append("  To accept these and fail only on new ones: --baseline with this run's report.json.")
        return "\n".join(lines)


def judge(rows: list[FindingRow], severity: str, baseline: Baseline | None = None) -> Verdict:
    """Whether the findings ``rows`` (a report's) pass a gate at ``severity``."""
    serious = at_or_worse(rows, severity)
    failing = baseline.new(serious) if baseline is not None else serious
    return Verdict(severity, failing, len(serious) - len(failing), baseline.source if baseline is not None else None)
