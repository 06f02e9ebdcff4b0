"""The report's findings as SARIF 2.1.0, the format code-scanning tools read (GitHub's among them),
and as GitHub Actions workflow commands (``::error file=...,line=...::...``).

One rule per finding kind (its meaning, fix and severity); one result per report row, at its file
and line relative to the repository root (places.repository_root), with the code line as the
region's snippet and the row's fingerprint, which baselines match.
"""
from __future__ import annotations

import json
import os
import urllib.parse

from torch_neuronx.diagnostics import findings, gate
from torch_neuronx.diagnostics.rows import FindingRow
from torch_neuronx.version import __version__

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
ROOT_BASE = "%SRCROOT%"
LIBRARY_BASE = "SITE_PACKAGES"
# How each severity shows in code scanning (SARIF's levels: error, warning, note).
LEVELS = {"would-fail": "error", "computes-differently": "warning", "runs-slowly": "note", "near-limit": "note"}
# GitHub's workflow command per level.
COMMANDS = {"error": "error", "warning": "warning", "note": "notice"}


def _rules() -> list[dict]:
    return [{"id": kind, "name": "".join(part.title() for part in kind.split("-")),
             "shortDescription": {"text": f"{findings.SEVERITIES[meta.severity][0].upper()}"
                                          f"{findings.SEVERITIES[meta.severity][1:]}: {kind}"},
             "fullDescription": {"text": meta.meaning[0].upper() + meta.meaning[1:] + "."},
             "help": {"text": f"Fix: {meta.fix}."},
             "defaultConfiguration": {"level": LEVELS[meta.severity]},
             "properties": {"severity": meta.severity, "tags": ["trainium", "torch-neuronx", meta.severity]}}
            for kind, meta in findings.KINDS.items()]


def message(row: FindingRow) -> str:
    """One line a reviewer reads beside the code: what happens on Trainium, what was seen, the fix."""
    seen = ", ".join(f"{op.removeprefix('aten::').partition('.')[0]} x{n}" for op, n in row.ops.items()
                     if op != "-")
    details = "; ".join(row.details)
    where = f" (in {' and '.join(row.context)})" if row.context else ""
    seen_text = "; ".join(part for part in (seen, details) if part)
    return (f"[{row.kind}] {row.meaning[0].upper()}{row.meaning[1:]}{where}. Seen: {seen_text}. "
            f"Fix: {row.fix}.")


def _location(row: FindingRow) -> dict:
    if not row.path:  # a device (memory), or a site without a file
        return {"logicalLocations": [{"name": row.site, "kind": "resource"}]}
    path = row.path.replace(os.sep, "/")
    if row.in_repository:
        artifact = {"uri": urllib.parse.quote(path), "uriBaseId": ROOT_BASE}
    elif os.path.isabs(row.path):
        artifact = {"uri": "file://" + urllib.parse.quote(path)}
    else:  # an installed library's file, named from its site-packages
        artifact = {"uri": urllib.parse.quote(path), "uriBaseId": LIBRARY_BASE}
    region = {"startLine": row.line}
    if row.code:
        region["snippet"] = {"text": row.code}
    return {"physicalLocation": {"artifactLocation": artifact, "region": region}}


def log(rows: list[FindingRow], root: str, exit_status: int | None = None,
        new: list[FindingRow] | None = None) -> dict:
    """The SARIF log of a report's findings rows (``root``: the repository root their paths start at;
    ``new``: the rows a baseline does not hold, when there is one: each result then says new or
    unchanged; ``exit_status``: the run's, when it ran)."""
    kinds = list(findings.KINDS)
    fresh = None if new is None else {id(row) for row in new}
    results = []
    for row in rows:
        result = {"ruleId": row.kind, "level": LEVELS.get(row.severity, "warning"),
                  "message": {"text": message(row)}, "locations": [_location(row)],
                  "partialFingerprints": {gate.SARIF_FINGERPRINT: row.fingerprint},
                  "occurrenceCount": row.count}
        if row.kind in kinds:
            result["ruleIndex"] = kinds.index(row.kind)
        if fresh is not None:
            result["baselineState"] = "new" if id(row) in fresh else "unchanged"
        results.append(result)
    run = {"tool": {"driver": {"name": "torch-neuronx-cpu readiness", "version": __version__,
                               "semanticVersion": __version__, "rules": _rules()}},
           "originalUriBaseIds": {ROOT_BASE: {"uri": "file://" + urllib.parse.quote(root.rstrip("/") + "/")}},
           "results": results}
    if exit_status is not None:
        run["invocations"] = [{"executionSuccessful": exit_status == 0, "exitCode": exit_status}]
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}


def render(rows: list[FindingRow], root: str, exit_status: int | None = None,
           new: list[FindingRow] | None = None) -> str:
    return json.dumps(log(rows, root, exit_status, new), indent=1)


def _escape(text: str, property_: bool = False) -> str:
    """GitHub's escaping of a workflow command's message (and, with ``property_``, of its properties)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_ else text


def annotations(rows: list[FindingRow]) -> list[str]:
    """A workflow command per row (worst first, as the rows come), for the job's log and the pull
    request's diff: ``::error file=src/train.py,line=12,title=...::...``."""
    lines = []
    for row in rows:
        level = COMMANDS[LEVELS.get(row.severity, "warning")]
        title = _escape(f"{findings.SEVERITIES.get(row.severity, row.severity)}: {row.kind}", True)
        where = ""
        if row.in_repository:
            where = f"file={_escape(row.path.replace(os.sep, '/'), True)},line={row.line},"
        lines.append(f"::{level} {where}title={title}::{_escape(message(row))}")
    return lines
