"""The readiness report as a CI gate: python -m torch_neuronx.run --fail-on and --baseline, its SARIF
(checked against a schema written from the SARIF 2.1.0 standard), GitHub's workflow annotations, and
the pytest plugin (pytest --neuron-readiness), each run as a user runs them, in a fresh process."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import jsonschema
import pytest

import torch_neuronx_pytest
from torch_neuronx.diagnostics import findings, gate, places, sarif
from torch_neuronx.diagnostics.rows import FindingRow

from helpers import isolated

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCHEMA = json.loads((TESTS / "data" / "sarif-2.1.0.schema.json").read_text())
# A copy to channels_last: TorchNeuron refuses it (would-fail); float64: computes differently.
COPY = "y = x.to(memory_format=torch.channels_last)"
SCRIPT = f"""import sys
import torch
x = torch.ones(2, 3, 4, 4, device="neuron")
{COPY}
z = torch.ones(3, device="neuron", dtype=torch.float64) * 2
print("script ran")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""
COPY_LINE = 4


def run(cwd, *args, **env):
    """python -m torch_neuronx.run, as a CI job runs it; no GitHub variables unless given."""
    clean = {k: v for k, v in isolated.environment(**env).items()
             if k not in ("GITHUB_ACTIONS", "GITHUB_WORKSPACE", gate.FAIL_ON_ENV) or k in env}
    return subprocess.run([sys.executable, "-m", "torch_neuronx.run", *args], capture_output=True, text=True,
                          cwd=cwd, env=clean, timeout=300)


@pytest.fixture
def project(tmp_path):
    """A project with a script that copies to channels_last (line 4) and makes float64 (line 5)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def test_fail_on_would_fail_exits_3_and_a_baseline_accepts_what_it_holds(project):
    failed = run(project, "--fail-on", "would-fail", "train.py")
    assert failed.returncode == gate.EXIT_FINDINGS, failed.stderr
    assert "script ran" in failed.stdout
    assert "Readiness gate (fail on would-fail): FAILED, exit status 3: 1 place would fail on Trainium" \
        in failed.stderr
    assert f"train.py:{COPY_LINE}  [layout-change]  {COPY}" in failed.stderr
    assert "computes differently" not in failed.stderr.split("Readiness gate")[1]  # float64 is not fatal
    baseline = project / "baseline.json"
    baseline.write_text((project / "neuron_report" / "report.json").read_text())

    accepted = run(project, "--fail-on", "would-fail", "--baseline", str(baseline), "train.py")
    assert accepted.returncode == 0, accepted.stderr
    assert "passed, nothing new that would fail on Trainium; 1 accepted by the baseline" in accepted.stderr

    # Lines added above the copy move it, and keep it accepted; a second copy is new.
    moved = SCRIPT.replace("import sys\n", "import sys\n\n# a comment\n").replace(
        COPY + "\n", f"{COPY}\nw = x.to(memory_format=torch.channels_last)\n")
    (project / "train.py").write_text(moved)
    new = run(project, "--fail-on", "would-fail", "--baseline", str(baseline), "train.py")
    assert new.returncode == gate.EXIT_FINDINGS, new.stderr
    verdict = new.stderr.split("Readiness gate")[1]
    assert "(new since the baseline); 1 accepted by the baseline" in verdict
    assert f"train.py:{COPY_LINE + 3}  [layout-change]  w = x.to(" in verdict and COPY not in verdict


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_the_gate_follows_the_severity_the_variable_and_the_scripts_own_status(project):
    stricter = run(project, "--fail-on", "computes-differently", "train.py")
    assert stricter.returncode == gate.EXIT_FINDINGS
    assert "2 places would fail or compute differently on Trainium" in stricter.stderr
    assert run(project, "train.py", **{gate.FAIL_ON_ENV: "would-fail"}).returncode == gate.EXIT_FINDINGS
    off = run(project, "--fail-on", "none", "train.py", **{gate.FAIL_ON_ENV: "would-fail"})
    assert off.returncode == 0 and "Readiness gate" not in off.stderr
    no_gate = run(project, "train.py")
    assert no_gate.returncode == 0 and "Readiness gate" not in no_gate.stderr  # the report alone keeps 0
    own = run(project, "--fail-on", "would-fail", "train.py", "5")
    assert own.returncode == 5  # the script's failure wins over the gate's


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_mistakes_are_refused_before_the_script_runs(project):
    bad = run(project, "--fail-on", "fatal", "train.py")
    assert bad.returncode == 2 and "--fail-on='fatal' is not a severity: use one of would-fail" in bad.stderr
    env = run(project, "train.py", **{gate.FAIL_ON_ENV: "sometimes"})
    assert env.returncode == 2 and f"{gate.FAIL_ON_ENV}='sometimes' is not a severity" in env.stderr
    (project / "corrupt.json").write_text('{"findings": [')
    corrupt = run(project, "--baseline", "corrupt.json", "train.py")
    assert corrupt.returncode == 2 and "baseline corrupt.json: not JSON" in corrupt.stderr
    assert "pass a report.json (or report.sarif) that python -m torch_neuronx.run wrote" in corrupt.stderr
    (project / "other.json").write_text('{"name": "not a report"}')
    other = run(project, "--baseline", "other.json", "train.py")
    assert other.returncode == 2 and "baseline other.json: not a readiness report" in other.stderr
    missing = run(project, "--baseline", "gone.json", "train.py")
    assert missing.returncode == 2 and "baseline gone.json: cannot be read (No such file or directory)" \
        in missing.stderr
    formats = run(project, "--format", "txt,pdf", "train.py")
    assert formats.returncode == 2 and "--format txt,pdf: use one or more of txt, json, html, sarif" in formats.stderr
    assert not any("script ran" in r.stdout for r in (bad, env, corrupt, other, missing, formats))
    assert not (project / "neuron_report").exists()


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_github_actions_annotations_and_a_sarif_baseline(project):
    github = {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(project)}
    first = run(project, "--format", "sarif", "train.py", **github)
    assert first.returncode == 0, first.stderr
    assert sorted(os.listdir(project / "neuron_report")) == ["report.sarif"]
    commands = [line for line in first.stdout.splitlines() if line.startswith("::")]
    assert len(commands) == 2, first.stdout
    assert commands[0].startswith(f"::error file=train.py,line={COPY_LINE},title=would fail on Trainium%3A "
                                  "layout-change::[layout-change] TorchNeuron refuses a copy")
    assert commands[1].startswith("::warning file=train.py,line=5,title=computes differently on Trainium%3A "
                                  "float64::")
    # The SARIF as a baseline: only a new finding is annotated, and fails.
    (project / "train.py").write_text(SCRIPT.replace(COPY, f"{COPY}; w = x.double()"))
    second = run(project, "--fail-on", "computes-differently", "--baseline", "neuron_report/report.sarif",
                 "--output-dir", "second", "--format", "json,sarif", "train.py", **github)
    assert second.returncode == gate.EXIT_FINDINGS, second.stderr
    commands = [line for line in second.stdout.splitlines() if line.startswith("::")]
    # The copy's line changed (its text is part of its fingerprint), so both its findings are new;
    # float64 on line 5 is the baseline's, and not annotated again.
    assert [c.split(",title=")[0] for c in commands] == [f"::error file=train.py,line={COPY_LINE}",
                                                         f"::warning file=train.py,line={COPY_LINE}"]
    log = json.loads((project / "second" / "report.sarif").read_text())
    states = {(r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"], r["baselineState"])
              for r in log["runs"][0]["results"]}
    assert states == {("layout-change", COPY_LINE, "new"), ("float64", COPY_LINE, "new"),
                      ("float64", 5, "unchanged")}
    assert log["runs"][0]["invocations"] == [{"executionSuccessful": False, "exitCode": gate.EXIT_FINDINGS}]


def _line(path: Path, number: int) -> str:
    return path.read_text().splitlines()[number - 1].strip()


def test_the_sarif_of_the_readiness_program_validates_and_names_each_line(tmp_path):
    program = TESTS / "programs" / "train_small.py"
    result = run(REPO, "--format", "sarif,json", "--output-dir", str(tmp_path), str(program),
                 GITHUB_WORKSPACE=str(REPO))
    assert result.returncode == 0, result.stderr
    log = json.loads((tmp_path / "report.sarif").read_text())
    jsonschema.validate(log, SCHEMA)
    rows = json.loads((tmp_path / "report.json").read_text())["findings"]
    (run_,) = log["runs"]
    assert run_["originalUriBaseIds"]["%SRCROOT%"]["uri"] == REPO.as_uri() + "/"
    rules = [rule["id"] for rule in run_["tool"]["driver"]["rules"]]
    assert rules == list(findings.KINDS)
    assert len(run_["results"]) == len(rows) >= 2
    for result_, row in zip(run_["results"], rows):
        (location,) = result_["locations"]
        artifact, region = location["physicalLocation"]["artifactLocation"], location["physicalLocation"]["region"]
        assert artifact == {"uri": "tests/programs/train_small.py", "uriBaseId": "%SRCROOT%"}
        assert region["startLine"] == row["line"] and region["snippet"]["text"] == _line(program, row["line"])
        assert rules[result_["ruleIndex"]] == result_["ruleId"] == row["kind"]
        assert result_["level"] == sarif.LEVELS[row["severity"]]
    lines = {(r["ruleId"], _line(program, r["locations"][0]["physicalLocation"]["region"]["startLine"]))
             for r in run_["results"]}
    assert ("float64", "check = (w.double() * 3).sum()") in lines
    assert ("host-sync-in-loop", 'print(f"step {step}: loss {loss.item():.4f}")') in lines
    broken = json.loads(json.dumps(log))
    broken["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    with pytest.raises(jsonschema.ValidationError, match="less than the minimum of 1"):
        jsonschema.validate(broken, SCHEMA)  # the schema can fail


def _row(kind="layout-change", path="src/train.py", line=3, code="y = x.cuda()", site=None, **extra) -> FindingRow:
    meta = findings.KINDS[kind]
    site = site or f"/repo/{path}:{line}"
    fields = {"kind": kind, "severity": meta.severity, "meaning": meta.meaning, "fix": meta.fix, "count": 1,
              "ops": {"aten::_to_copy": 1}, "details": [], "context": [], "path": path, "line": line, "code": code,
              "site": site, "in_repository": path is not None and not path.startswith("/"),
              "file": None if path is None else f"/repo/{path}", "sources": [],
              "fingerprint": places.fingerprint(kind, path, code, site), **extra}
    return FindingRow(**fields)


def test_baselines_match_by_kind_file_and_code_line_as_a_multiset(tmp_path):
    accepted = _row()
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"findings": [accepted.to_dict()]}))
    baseline = gate.Baseline.load(str(report))
    moved = _row(line=30)  # the same code line further down: the same finding
    assert baseline.new([moved]) == []
    twice = [moved, _row(line=31)]  # a second copy of the line is one more than the baseline holds
    assert baseline.new(twice) == [twice[1]]
    other_file, other_kind = _row(path="src/eval.py"), _row(kind="float64")
    assert baseline.new([other_file, other_kind]) == [other_file, other_kind]
    device = _row(kind="memory", path=None, line=None, code="", site="neuron:0")
    assert places.fingerprint("memory", None, "", "neuron:0") == device.fingerprint != \
        places.fingerprint("memory", None, "", "neuron:1")
    old = {k: v for k, v in accepted.to_dict().items() if k not in ("fingerprint", "path", "in_repository")}
    old["file"] = os.path.join(places.repository_root(), "src", "train.py")  # a report from before fingerprints
    report.write_text(json.dumps({"findings": [old]}))
    assert gate.Baseline.load(str(report)).new([moved]) == []


def test_verdicts_and_thresholds():
    rows = [_row(), _row(kind="float64", line=5, code="z = x.double()")]
    assert gate.threshold(None) is None and gate.threshold(" None ") is None
    assert gate.threshold("Runs-Slowly") == "runs-slowly"
    with pytest.raises(ValueError, match="--fail-on='often' is not a severity: use one of would-fail, "
                                         "computes-differently, runs-slowly, near-limit"):
        gate.threshold("often")
    assert [r.kind for r in gate.at_or_worse(rows, "would-fail")] == ["layout-change"]
    assert len(gate.at_or_worse(rows, "near-limit")) == 2
    verdict = gate.judge(rows, "would-fail")
    assert not verdict.passed and verdict.failing == [rows[0]]
    assert "src/train.py:3  [layout-change]  y = x.cuda()" in verdict.text()
    assert "--baseline with this run's report.json" in verdict.text()
    assert gate.judge(rows[1:], "would-fail").passed


def test_annotations_escape_what_github_reads_as_syntax():
    row = _row(path="src/a,b:c.py", code="x = 1", details=["50% of it\nand more"])
    (command,) = sarif.annotations([row])
    assert command.startswith("::error file=src/a%2Cb%3Ac.py,line=3,title=would fail on Trainium%3A layout-change::")
    assert "50%25 of it%0Aand more" in command and "\n" not in command
    library = _row(path="diffusers/models/x.py", in_repository=False)
    assert sarif.annotations([library])[0].startswith("::error title=")  # not a file of the repository


def test_synthetic_sarif_of_every_kind_of_place_validates():
    rows = [_row(), _row(kind="memory", path=None, line=None, code="", site="neuron:0"),
            _row(kind="float64", path="diffusers/models/x.py", in_repository=False),
            _row(kind="float64", path="/elsewhere/x.py", in_repository=False)]
    log = sarif.log(rows, "/repo", exit_status=0, new=rows[:1])
    jsonschema.validate(log, SCHEMA)
    locations = [r["locations"][0] for r in log["runs"][0]["results"]]
    assert locations[1] == {"logicalLocations": [{"name": "neuron:0", "kind": "resource"}]}
    assert locations[2]["physicalLocation"]["artifactLocation"]["uriBaseId"] == sarif.LIBRARY_BASE
    assert locations[3]["physicalLocation"]["artifactLocation"]["uri"] == "file:///elsewhere/x.py"
    assert [r["baselineState"] for r in log["runs"][0]["results"]] == ["new", "unchanged", "unchanged", "unchanged"]


# ---- the pytest plugin ----

TEST_FILE = f"""import torch


def test_plain():
    x = torch.ones(2, 3, 4, 4, device="neuron")
    assert (x + 1).sum().item() == 192


def test_copy_to_channels_last():
    x = torch.ones(2, 3, 4, 4, device="neuron")
    {COPY}
    assert y.shape == x.shape


def test_float64():
    assert torch.ones(3, device="neuron", dtype=torch.float64).sum().item() == 3
"""


def pytest_run(cwd, *args, **env):
    """pytest in a fresh process, outside this suite's configuration (and its xdist worker's)."""
    clean = {k: v for k, v in isolated.environment(**env).items()
             if not k.startswith(("PYTEST_", gate.FAIL_ON_ENV)) or k in env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=cwd, env=clean, timeout=300)


def _outcomes(junit: Path) -> dict[str, tuple[str, list[str]]]:
    """Each test's outcome and neuron_readiness properties, from the JUnit XML."""
    out = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        outcome = "failed" if case.find("failure") is not None else "error" if case.find("error") is not None \
            else "passed"
        props = [p.get("value") for p in case.iter("property") if p.get("name") == torch_neuronx_pytest.PROPERTY]
        out[case.get("name")] = (outcome, props)
    return out


@pytest.mark.parametrize("workers", [[], pytest.param(["-n", "2"], marks=pytest.mark.long)],
                         ids=["one-process", "xdist"])  # xdist: make test-long
def test_the_plugin_fails_exactly_the_test_that_would_fail_on_trainium(tmp_path, workers):
    (tmp_path / "test_model.py").write_text(TEST_FILE)
    result = pytest_run(tmp_path, *workers, "--neuron-readiness", "test_model.py", "--junitxml=junit.xml")
    assert result.returncode == 1, result.stdout + result.stderr
    outcomes = _outcomes(tmp_path / "junit.xml")
    assert {name: outcome for name, (outcome, _) in outcomes.items()} == {
        "test_plain": "passed", "test_copy_to_channels_last": "failed", "test_float64": "passed"}
    assert outcomes["test_copy_to_channels_last"][1] == [f"would-fail [layout-change] test_model.py:11  {COPY}"]
    assert outcomes["test_float64"][1] == [
        'computes-differently [float64] test_model.py:16  assert torch.ones(3, device="neuron", '
        'dtype=torch.float64).sum().item() == 3']
    assert outcomes["test_plain"][1] == []
    assert "neuron readiness: 1 finding of would-fail or worse in this test's call" in result.stdout
    summary = result.stdout.split("= neuron readiness =")[1]
    assert "2 places found in 2 tests (fail on would-fail; 1 failed for it)" in summary
    assert f"would-fail            layout-change  test_model.py:11  {COPY}" in summary
    assert "in test_model.py::test_copy_to_channels_last" in summary


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_the_plugins_severity_comes_from_the_option_or_the_variable(tmp_path):
    (tmp_path / "test_model.py").write_text(TEST_FILE)
    strict = pytest_run(tmp_path, "--neuron-readiness=computes-differently", "test_model.py")
    assert strict.returncode == 1 and "2 failed, 1 passed" in strict.stdout
    from_env = pytest_run(tmp_path, "--neuron-readiness", "test_model.py",
                          **{gate.FAIL_ON_ENV: "computes-differently"})
    assert "2 failed, 1 passed" in from_env.stdout
    observe = pytest_run(tmp_path, "--neuron-readiness", "none")
    assert observe.returncode == 0 and "(observe only; 0 failed for it)" in observe.stdout
    bad = pytest_run(tmp_path, "--neuron-readiness=fatal", "test_model.py")
    assert bad.returncode == 4 and "--neuron-readiness='fatal' is not a severity" in bad.stderr
    unobserved = pytest_run(tmp_path, "test_model.py")
    assert unobserved.returncode == 0 and "neuron readiness" not in unobserved.stdout


def test_the_plugin_costs_nothing_unless_asked_for():
    light = isolated.run("""
        import sys
        import torch_neuronx_pytest
        print(sorted(m for m in ("torch", "torch_neuronx") if m in sys.modules))
    """)
    assert light.returncode == 0 and light.stdout.strip() == "[]", light.stderr
    assert torch_neuronx_pytest.SEVERITIES == tuple(gate.ORDER)
    assert (torch_neuronx_pytest.FAIL_ON_ENV, torch_neuronx_pytest.NEVER) == (gate.FAIL_ON_ENV, gate.NEVER)


def test_this_suite_runs_without_the_observer(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("neuron_readiness")  # registered by its entry point
    assert pytestconfig.pluginmanager.get_plugin("neuron-readiness-observer") is None


def test_the_report_at_exit_says_it_is_no_gate():
    code = 'import torch; torch.ones(2, device="neuron").to(memory_format=torch.contiguous_format)'
    gated = isolated.run(code, TORCH_NEURONX_REPORT="1", **{gate.FAIL_ON_ENV: "would-fail"})
    assert gated.returncode == 0 and "Trainium readiness report (" in gated.stderr
    assert f"{gate.FAIL_ON_ENV} is read by python -m torch_neuronx.run and pytest --neuron-readiness; " \
           "TORCH_NEURONX_REPORT=1 keeps the program's exit status" in gated.stderr
    plain = isolated.run(code, TORCH_NEURONX_REPORT="1")
    assert "Trainium readiness report (" in plain.stderr and gate.FAIL_ON_ENV not in plain.stderr
