"""Findings as the report shows them: one row per source line and kind, worst first.

The detector records a finding per (kind, op, site). A reader wants the line: its code, what
happens there on Trainium, and the change to make. So the findings of one line and kind merge
into one row (their ops and counts kept), rows are sorted by severity and then by file and line,
and the sources behind the unsupported-op table become numbered footnotes.
"""
from __future__ import annotations

import hashlib
import linecache
import os
import sys
from dataclasses import dataclass, field

from torch_neuronx.diagnostics.findings import KINDS, SEVERITIES, Finding, lowering_fix
from torch_neuronx.diagnostics.rows import FindingRow, SourceRow
from torch_neuronx.python_ops import host_ops, op_classes

CODE_LIMIT = 160  # characters of a source line shown
COMPILED_SUFFIX = " (compiled)"


def split_site(site: str) -> tuple[str | None, int | None, str]:
    """'file:line' -> (file, line, ''); 'backward (MulBackward0) from file:line' -> (..., 'backward
    (MulBackward0)'); 'file:line (compiled)' -> (..., 'a compiled graph'); no line -> (None, None, '')."""
    context = ""
    if site.startswith("backward ("):
        node, _, rest = site[len("backward ("):].partition(")")
        context, site = f"backward ({node})", rest.removeprefix(" from ")
    if site.endswith(COMPILED_SUFFIX):
        context, site = context or "a compiled graph", site[:-len(COMPILED_SUFFIX)]
    filename, colon, line = site.rpartition(":")
    if colon and line.isdigit() and filename:
        return filename, int(line), context
    return None, None, context


def repository_root() -> str:
    """Where paths in SARIF, annotations and baselines start: the GitHub Actions workspace, else the
    git checkout around the working directory, else the working directory."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace and os.path.isdir(workspace):
        return os.path.abspath(workspace)
    here = os.getcwd()
    folder = here
    while True:
        if os.path.exists(os.path.join(folder, ".git")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return here
        folder = parent


def _library_roots() -> list[str]:
    return sorted((p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")), key=len,
                  reverse=True)


def library_path(path: str) -> str | None:
    """An installed library's file relative to its site-packages (diffusers/models/upsampling.py)."""
    for library in _library_roots():
        if path.startswith(library + os.sep):
            return os.path.relpath(path, library)
    return None


def relative_path(path: str, root: str) -> str:
    """A finding's file as another machine names it too: relative to site-packages for an installed
    library's file, to ``root`` when inside it, else in full."""
    library = library_path(path)
    if library is not None:
        return library
    if os.path.isabs(path):
        relative = os.path.relpath(path, root)
        return path if relative.startswith("..") else relative
    return path


def fingerprint(kind: str, path: str | None, code: str, site: str) -> str:
    """What identifies a finding from one run to the next, as baselines need: its kind, file and code
    line (not the line number, which moves as code is added above it); the site when there is no file."""
    what = f"{kind}\0{path}\0{code}" if path else f"{kind}\0{site}"
    return hashlib.sha256(what.encode()).hexdigest()[:32]


def source_line(filename: str | None, line: int | None) -> str:
    """The text of a source line, stripped ('' when the file cannot be read, e.g. ``python -c``)."""
    if not filename or not line:
        return ""
    text = linecache.getline(filename, line).strip()
    return text if len(text) <= CODE_LIMIT else text[:CODE_LIMIT - 3] + "..."


def short_op(op: str) -> str:
    """'aten::sum.dim_IntList' -> 'sum'; names that are not aten ops stay as they are."""
    return op[len("aten::"):].partition(".")[0] if op.startswith("aten::") else op


def _fix(kind: str, ops: dict[str, int], details: list[str]) -> str:
    if kind in ("cpu-fallback", "device-rng"):  # the table's fix for the op, when it has one
        fixes = [entry.fix for entry in map(op_classes.lookup, ops) if entry is not None]
        if fixes:
            return "; ".join(dict.fromkeys(fixes))
    if kind == "stablehlo-lowering":  # an op with a known way out
        fixes = [fix for fix in map(lowering_fix, ops) if fix]
        if fixes:
            return "; ".join(dict.fromkeys(fixes))
    fix = KINDS[kind].fix if kind in KINDS else ""
    if kind == "host-sync-in-loop":  # name what to move, from what the detector saw
        what = [name for name, prefix in ((".item()", ".item()"), (".cpu()", ".cpu()"), (".cpu()", "a copy"),
                                          ("print", "printing")) if any(d.startswith(prefix) for d in details)]
        if what:
            fix = f"move {' / '.join(dict.fromkeys(what))} out of the loop: " + fix.removeprefix("move it out of the loop: ")
    return fix


def _sources(kind: str, ops: dict[str, int]) -> list[str]:
    if kind not in ("cpu-fallback", "device-rng"):
        return []
    keys = [key for entry in map(op_classes.lookup, ops) if entry is not None for key in entry.sources]
    return list(dict.fromkeys(keys))


@dataclass
class _Place:
    """The findings of one line (or site) and kind, as they merge."""

    kind: str
    site: str
    file: str | None
    line: int | None
    context: list[str] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    count: int = 0
    details: list[str] = field(default_factory=list)

    @property
    def severity(self) -> str:
        return KINDS[self.kind].severity if self.kind in KINDS else "runs-slowly"

    def add(self, finding: Finding, context: str) -> None:
        self.ops[finding.op] = self.ops.get(finding.op, 0) + finding.count
        self.count += finding.count
        if finding.detail and finding.detail not in self.details:
            self.details.append(finding.detail)
        if context and context not in self.context:
            self.context.append(context)


def _merged(found: list[Finding]) -> list[_Place]:
    """The findings merged by line and kind (by site where there is no line), worst first."""
    merged: dict[tuple, _Place] = {}
    for f in found:
        filename, line, context = split_site(f.site)
        key = (f.kind, filename, line) if filename else (f.kind, f.site)
        if key not in merged:
            merged[key] = _Place(f.kind, f"{filename}:{line}" if filename else f.site, filename, line)
        merged[key].add(f, context)
    severity_order, kind_order = list(SEVERITIES), list(KINDS)
    return sorted(merged.values(), key=lambda p: (
        severity_order.index(p.severity), p.file is None, p.file or p.site, p.line or 0,
        kind_order.index(p.kind) if p.kind in kind_order else len(kind_order)))


def _row(place: _Place, footnotes: dict[str, int], root: str) -> FindingRow:
    """A merged place as the report's row; the sources it cites numbered in ``footnotes``."""
    kind = KINDS.get(place.kind)
    code = source_line(place.file, place.line)
    path = relative_path(place.file, root) if place.file else None
    return FindingRow(
        severity=place.severity, kind=place.kind, site=place.site, file=place.file, line=place.line, code=code,
        context=place.context, ops=place.ops, count=place.count, details=place.details,
        meaning=kind.meaning if kind else "", fix=_fix(place.kind, place.ops, place.details),
        sources=[footnotes.setdefault(key, len(footnotes) + 1) for key in _sources(place.kind, place.ops)],
        path=path,
        # Whether the file is the project's own (what code scanning can show in the repository).
        in_repository=bool(path) and not os.path.isabs(path) and library_path(place.file) is None,
        fingerprint=fingerprint(place.kind, path, code, place.site))


def rows(found: list[Finding]) -> tuple[list[FindingRow], list[SourceRow]]:
    """(one row per line and kind, sorted worst first; the footnotes the rows cite)."""
    footnotes: dict[str, int] = {}
    root = repository_root()
    ordered = [_row(place, footnotes, root) for place in _merged(found)]
    notes = [SourceRow(number, host_ops.SOURCES[key].name, host_ops.SOURCES[key].url)
             for key, number in footnotes.items()]
    return ordered, notes


def places_by_severity(found_rows: list[FindingRow]) -> dict[str, int]:
    """How many places (source lines, or devices) have a finding of each severity."""
    seen: dict[str, set] = {severity: set() for severity in SEVERITIES}
    for row in found_rows:
        seen.setdefault(row.severity, set()).add(row.site)
    return {severity: len(sites) for severity, sites in seen.items()}
