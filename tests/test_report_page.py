"""The readiness report as a user reads it, on the small training program in tests/programs/
(a float64 line, randn(device="neuron") lines, an .item() in the loop) run under
`python -m torch_neuronx.run`: the verdict first, findings one row per source line and kind with the
code shown, readable numbers, every surface in the same order, the JSON schema, and the page
rendered in headless Chromium.

The Chromium test saves what the browser rendered in artifacts/readiness-report/ at the repository
root (ignored by git): report.html, report.png (a screenshot) and report.pdf (the page printed).
"""
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

from helpers import isolated

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "programs", "train_small.py")
ARTIFACTS = os.path.join(ROOT, "artifacts", "readiness-report")
LINE_16 = "check = (w.double() * 3).sum()"
# The text report's sections, in order (each starts a line).
SECTIONS = ["Trainium readiness report", "Verdict (", "Findings, worst first", "ESTIMATED time on Trainium2",
            "What ran on neuron", "Memory (", "Assumptions ("]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The program under python -m torch_neuronx.run: (stderr, report.txt, report.json as a dict, html path)."""
    folder = tmp_path_factory.mktemp("report")
    result = subprocess.run([sys.executable, "-m", "torch_neuronx.run", "--output-dir", "out", PROGRAM],
                            capture_output=True, text=True, env=isolated.environment(), cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "step 9: loss" in result.stdout
    out = folder / "out"
    return (result.stderr, (out / "report.txt").read_text(), json.loads((out / "report.json").read_text()),
            str(out / "report.html"))


def test_program_line_16_is_the_float64_line():
    with open(PROGRAM) as f:
        lines = f.read().splitlines()
    assert len(lines) == 17 and lines[15].strip() == LINE_16


def test_report_opens_with_the_verdict(run):
    stderr, text, data, _ = run
    title, verdict = text.splitlines()[:2]
    assert title.startswith("Trainium readiness report") and verdict == data["verdict"]["text"]
    assert verdict.startswith("Verdict (ready with changes): 0 places would fail on Trainium, 2 compute differently, "
                              "3 run slowly; estimated on Trainium2 at LNC=2: a first run of ")
    assert data["verdict"]["places"] == {"would-fail": 0, "computes-differently": 2, "runs-slowly": 3, "near-limit": 0}
    assert text.strip() in stderr  # the same report on stderr and in report.txt


def test_findings_one_row_per_line_and_kind_with_the_code(run):
    _, text, data, _ = run
    rows = data["findings"]
    by_line = {}
    for row in rows:
        assert row["file"] == PROGRAM
        by_line.setdefault(row["line"], []).append(row["kind"])
    assert by_line == {16: ["float64"], 17: ["float64"], 5: ["device-rng"], 6: ["device-rng"],
                       14: ["host-sync-in-loop"]}
    (line_16,) = [r for r in rows if r["line"] == 16]
    assert line_16["code"] == LINE_16 and line_16["severity"] == "computes-differently"
    assert line_16["ops"] == {"aten::_to_copy": 1, "aten::mul.Tensor": 1, "aten::sum.dim_IntList": 1}
    assert "keep float32" in line_16["fix"]
    (loop,) = [r for r in rows if r["line"] == 14]
    assert loop["ops"] == {"aten::_local_scalar_dense": 10} and "move .item() out of the loop" in loop["fix"]
    (rng,) = [r for r in rows if r["line"] == 5]
    assert "create the tensor on the CPU and move it" in rng["fix"] and rng["sources"] == [1]
    # Worst first: computes differently, then runs slowly; by line within each.
    assert [(r["severity"], r["line"]) for r in rows] == [
        ("computes-differently", 16), ("computes-differently", 17), ("runs-slowly", 5), ("runs-slowly", 6),
        ("runs-slowly", 14)]
    # In the text: line 16 once, with its code; the sources as footnotes with links, never "the spec".
    assert len(re.findall(r"train_small\.py:16\b", text)) == 1
    assert re.search(r"train_small\.py:16\s+\[float64\]\s+" + re.escape(LINE_16), text)
    assert "Seen:  _to_copy x1, mul x1, sum x1" in text
    assert "[1] TorchNeuron 0.1.0 source" in text and "https://github.com/" in text
    assert "the spec" not in text.lower() and "the spec" not in json.dumps(data).lower()


def test_numbers_are_readable(run):
    _, text, data, _ = run
    assert "0.0000" not in text and not re.search(r"\b0\.000 ", text)
    number = r"\d+(\.\d+)? (ns|µs|ms|s)"
    # then the estimate and its interval (the model's held-out error on AWS's rows)
    assert re.search(rf"a first run of {number}–{number} \(\d+ NEFFs to compile\), then {number} "
                     rf"\({number}–{number}\) per run "
                     rf"\(\d+ launches; roofline {number}\)", data["verdict"]["text"]), data["verdict"]["text"]
    for row in data["memory"]:
        assert f"{row['device']}: " in text
    # The timeline starts at the first neuron allocation, and the table's peak bounds it.
    timeline = data["memory_timeline"]
    assert timeline[0][0] == 0.0 and timeline[0][1] > 0
    assert max(b for _, b in timeline) <= data["memory"][0]["peak_bytes"]


def test_every_surface_has_the_same_sections_in_the_same_order(run):
    _, text, _, html_path = run
    env_run = subprocess.run([sys.executable, PROGRAM], capture_output=True, text=True, timeout=300,
                             env=isolated.environment(TORCH_NEURONX_REPORT="1"))
    assert env_run.returncode == 0, env_run.stderr
    for report in (text, env_run.stderr[env_run.stderr.index("Trainium readiness report"):]):
        positions = [report.find(section) for section in SECTIONS]
        assert -1 not in positions and positions == sorted(positions), (positions, report[:2000])
    pid = re.compile(r"pid \d+")
    unindented = lambda report: [pid.sub("pid N", line) for line in report.splitlines()  # noqa: E731
                                 if line and not line.startswith(" ")]
    from_env = env_run.stderr[env_run.stderr.index("Trainium readiness report"):]
    assert unindented(from_env) == unindented(text)
    with open(html_path, encoding="utf-8") as f:
        page = f.read()
    ids = [page.index(f'id="{name}"') for name in ("verdict", "findings", "estimate", "ran", "memory", "assumptions")]
    assert ids == sorted(ids)


def test_json_schema(run):
    _, _, data, _ = run
    assert data["schema_version"] == 3
    top = {"schema_version": int, "verdict": dict, "process": str, "profile": dict, "collected": bool,
           "findings": list, "sources": list, "estimated_ms": float, "steady_state_seconds": float,
           "steady_state_interval_seconds": list, "first_run_seconds": list, "phases": list, "families": list,
           "signatures": list, "compiled_graphs": list, "neffs": list, "host_syncs": int,
           "executed_ops": dict, "fallback_ops": dict, "memory": list, "memory_timeline": list,
           "memory_timeline_device": str, "assumptions": list}
    assert list(data) == list(top)  # the order too: the verdict first, as every surface shows it
    assert all(isinstance(data[key], kind) for key, kind in top.items()), {k: type(v) for k, v in data.items()}
    assert set(data["verdict"]) == {"status", "places", "estimated_ms", "neffs", "first_run_seconds",
                                    "steady_state_seconds", "steady_state_interval_seconds", "text"}
    row = {"severity": str, "kind": str, "site": str, "file": (str, type(None)), "line": (int, type(None)),
           "code": str, "context": list, "ops": dict, "count": int, "details": list, "meaning": str, "fix": str,
           "sources": list, "path": (str, type(None)), "in_repository": bool, "fingerprint": str}
    for finding in data["findings"]:
        assert list(finding) == list(row) and all(isinstance(finding[k], t) for k, t in row.items()), finding
    for source in data["sources"]:
        assert set(source) == {"id", "name", "url"} and source["url"].startswith("https://")
    assert set(data["phases"][0]) == {"name", "wall_s", "eager_calls", "compiled_graph_calls", "estimated_ms",
                                      "launches", "steady_state_ms", "families"}
    assert all(set(n) == {"kind", "name", "inputs", "calls", "launches"} for n in data["neffs"])
    assert set(data["families"][0]) == {"family", "calls", "flops", "bytes", "estimated_ms", "bound"}
    assert set(data["signatures"][0]) == {"op", "inputs", "family", "calls", "flops", "bytes", "estimated_us"}
    assert set(data["memory"][0]) == {"device", "peak_bytes", "emulated_capacity_bytes"}
    assert all(len(point) == 2 for point in data["memory_timeline"])


def test_the_first_run_is_counted_in_neffs_and_seconds(run):
    """train_small.py compiles one NEFF per distinct eager kernel key (op, shapes, dtypes), none for its
    views, host transfers and random ops (which TorchNeuron runs on the CPU); the first run costs
    their compiles (1.4-5.1 s each) plus a warm run, which costs its launches plus the roofline time:
    one estimate, and the interval of the time model's held-out error."""
    from torch_neuronx.trainium import neff_forecast, time_model

    _, text, data, _ = run
    neffs, verdict = data["neffs"], data["verdict"]
    names = {n["name"] for n in neffs}
    assert verdict["neffs"] == len(neffs) == len({(n["name"], tuple(n["inputs"])) for n in neffs}) > 5
    assert {"aten::mm", "aten::addmm"} & names and not names & {"aten::normal_", "aten::_to_copy", "aten::view",
                                                                "aten::_local_scalar_dense"}, names
    launches = sum(n["launches"] for n in neffs)
    cal = time_model.CALIBRATION
    warm = data["estimated_ms"] / 1e3 + launches * cal.eager_launch_s  # train_small.py compiles no graph
    assert verdict["steady_state_seconds"] == pytest.approx(warm)
    assert verdict["steady_state_interval_seconds"] == pytest.approx([warm / cal.held_out[1], warm / cal.held_out[0]])
    compile_low, compile_high = neff_forecast.COMPILE_SECONDS
    assert verdict["first_run_seconds"] == pytest.approx([len(neffs) * compile_low + warm,
                                                          len(neffs) * compile_high + warm])
    assert 1 < verdict["first_run_seconds"][0] < verdict["first_run_seconds"][1] < 600  # seconds, not ns
    assert f"({len(neffs)} NEFFs to compile)" in text.splitlines()[1]


# ---- in a real browser ------------------------------------------------------------------------
def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = ("headless Chromium is needed to render the report page: install Debian's package with "
               "`apt-get install -y chromium` (.ci/run installs it)")
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(message)  # in CI a missing browser is a broken setup, never a skip
    pytest.skip(message)


class _Text(HTMLParser):
    """The rendered DOM's text, and the order its sections (elements with an id) come in."""

    def __init__(self):
        super().__init__()
        self.parts, self.ids = [], []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "script"):
            self._skip += 1
        element_id = dict(attrs).get("id")
        if element_id:
            self.ids.append(element_id)

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def test_report_page_in_chromium(run, tmp_path):
    browser = _chromium()
    _, _, data, html_path = run
    os.makedirs(ARTIFACTS, exist_ok=True)
    page = os.path.join(ARTIFACTS, "report.html")
    shutil.copyfile(html_path, page)
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--user-data-dir={tmp_path / 'profile'}"]
    url = "file://" + page
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0 and "<body" in dom.stdout, dom.stderr[-2000:]
    rendered = _Text()
    rendered.feed(dom.stdout)
    text = " ".join(" ".join(rendered.parts).split())
    sections = [i for i in rendered.ids if i in ("verdict", "findings", "estimate", "memory")]
    assert sections == ["verdict", "findings", "estimate", "memory"], rendered.ids
    assert data["verdict"]["text"] in text and LINE_16 in text
    assert text.index(LINE_16) < text.index("ESTIMATED time")
    assert "0.0000" not in text and "the spec" not in text.lower()
    assert dom.stdout.count("<svg") == 2  # the estimate by phase and family, and the memory timeline

    screenshot, printed = os.path.join(ARTIFACTS, "report.png"), os.path.join(ARTIFACTS, "report.pdf")
    for output in (screenshot, printed):
        if os.path.exists(output):
            os.remove(output)
    shot = subprocess.run([*common, "--window-size=1280,3600", f"--screenshot={screenshot}", url],
                          capture_output=True, text=True, timeout=180)
    pdf = subprocess.run([*common, "--no-pdf-header-footer", f"--print-to-pdf={printed}", url],
                         capture_output=True, text=True, timeout=180)
    assert shot.returncode == 0 and os.path.getsize(screenshot) > 10_000, shot.stderr[-2000:]
    assert pdf.returncode == 0 and os.path.getsize(printed) > 10_000, pdf.stderr[-2000:]
    print(f"\nthe report page as Chromium rendered it: {screenshot} (printed: {printed})")


def test_verdict_of_a_program_that_would_fail(collect):
    import torch

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed):
        torch.compile(lambda x: x + 1)(torch.ones(2, device="neuron"))  # Inductor on neuron
    torch._dynamo.reset()
    report = collect()
    assert report.verdict.status == "not ready" and report.verdict.places["would-fail"] == 1
    assert str(report).splitlines()[1].startswith("Verdict (not ready): 1 place would fail on Trainium")
    (row,) = [r for r in report.findings if r.severity == "would-fail"]
    assert row.kind == "inductor-on-neuron" and 'backend="neuron"' in row.fix


def test_where_names_an_installed_library_file_from_site_packages():
    from torch_neuronx.diagnostics import text

    root = next(p for p in sys.path if os.path.basename(p) == "site-packages")
    installed = SimpleNamespace(file=os.path.join(root, "diffusers", "models", "upsampling.py"), line=175, site="")
    assert text.where(installed) == "diffusers/models/upsampling.py:175"
    assert text.where(SimpleNamespace(file=None, line=None, site="neuron:0")) == "neuron:0"


def test_memory_near_a_cores_hbm_is_near_a_limit():
    code = """
        import torch
        from torch_neuronx import diagnostics
        diagnostics.start()
        x = torch.empty(14 * 2**30, dtype=torch.uint8, device="neuron")  # pages are never touched
        report = diagnostics.report()
        print([(f.kind, f.severity, f.site) for f in report.findings])
        print(report.verdict.text)
        """
    # trn1.2xlarge at LNC=1: a core has 16 GiB of HBM, minus the runtime's reservation; 14 GiB is over 80%.
    result = isolated.run(code, TORCH_NEURONX_INSTANCE_TYPE="trn1.2xlarge", TORCH_NEURONX_DEVICE_MEMORY="40GiB")
    assert result.returncode == 0, result.stderr
    found, verdict = result.stdout.strip().splitlines()
    assert found == "[('memory-headroom', 'near-limit', 'neuron:0')]"
    assert verdict.startswith("Verdict (ready with changes): 0 places would fail on Trainium, 0 compute differently, "
                              "0 run slowly, 1 is near a limit;")
