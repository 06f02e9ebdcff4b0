"""TorchNeuron's own test suite run against this package: one pytest process per file, each with a
timeout, counts per folder, and every failure with the first line of its message.

The tests come from a checkout of TorchNeuron's public repository (a work tree or a bare git
directory, as the search tool's fetch leaves it), never from this repository: ``tests/`` and the root
``conftest.py`` are exported into a scratch directory, without TorchNeuron's own ``torch_neuronx``
source, so ``import torch_neuronx`` finds the installed package. One shim is applied, the launcher
check: TorchNeuron's root conftest treats a machine without ``/dev/neuron0`` as a launcher that runs
no test, and a plugin of ours (loaded with ``-p``) makes ``is_launcher_env`` say it is not one.
Nothing a test asserts is changed. A file whose docstring says to run it under torchrun is run so.
The emulated instance is TorchNeuron's CI machine, a trn2.48xlarge (``TORCH_NEURONX_INSTANCE_TYPE``
set in the environment wins).

    python tests/helpers/torchneuron_suite.py --checkout PATH [--folders device,views,...]
        [--timeout 900] [--jobs 2] [--out DIR] [--files PATTERN]

``make torchneuron-suite TORCHNEURON=PATH`` runs the folders below and writes DIR/summary.md,
DIR/failures.txt and DIR/results.json (docs/torchneuron-suite.md holds a run's counts and causes).
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

FOLDERS = ("device", "views", "autocast", "allocator", "memory", "storage", "streams", "cpu_fallback", "operations",
           "python_ops", "neuron_dynamo_backend", "distributed/collective_ops", "distributed/process_group",
           "distributed/ddp_tests", "distributed/device", "distributed/dtensor",
           "distributed/neuron_dynamo_backend/tensor_parallel")
SHIM = '''"""The launcher check of TorchNeuron's root conftest, answered: this machine runs the tests."""


def pytest_configure(config):
    for plugin in config.pluginmanager.get_plugins():
        if callable(getattr(plugin, "is_launcher_env", None)):
            plugin.is_launcher_env = lambda session: False
'''
_TORCHRUN = re.compile(r"torchrun\s+--nproc[_-]per[_-]node[= ](\d+)\s+-m\s+pytest")
_MISSING = re.compile(r"(ModuleNotFoundError|ImportError|AttributeError): (.*)")


def export(checkout: str, workdir: str) -> str:
    """TorchNeuron's tests and root conftest, copied from ``checkout`` into ``workdir``; the commit."""
    if os.path.isdir(os.path.join(checkout, "tests")):
        shutil.copytree(os.path.join(checkout, "tests"), os.path.join(workdir, "tests"))
        shutil.copy(os.path.join(checkout, "conftest.py"), workdir)
    else:
        archive = subprocess.run(["git", "-C", checkout, "archive", "HEAD", "tests", "conftest.py"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", workdir], input=archive, check=True)
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True)
    for name, text in (("torchneuron_launcher_shim.py", SHIM), ("torchneuron_rank_pytest.py", RANK_RUNNER)):
        with open(os.path.join(workdir, name), "w") as f:
            f.write(text)
    return commit.stdout.strip() or "unknown"


def test_files(workdir: str, folders, pattern: str | None) -> list[str]:
    files = []
    for folder in folders:
        for root, _, names in os.walk(os.path.join(workdir, "tests", folder)):
            if folder.count("/") == 0 and os.path.relpath(root, os.path.join(workdir, "tests")).startswith(
                    "distributed"):
                continue
            files += [os.path.relpath(os.path.join(root, n), workdir) for n in names
                      if n.startswith("test_") and n.endswith(".py")]
    files = sorted(set(files))
    return [f for f in files if not pattern or re.search(pattern, f)]


RANK_RUNNER = '''"""pytest in one rank of a torchrun job, its JUnit XML named by the rank."""
import os
import sys

import pytest

xml, *args = sys.argv[1:]
sys.exit(pytest.main([*args, "--junitxml", f"{xml}.rank{os.environ.get('RANK', '0')}"]))
'''


def command(workdir: str, path: str, xml: str) -> list[str]:
    """pytest for one file, under torchrun when its docstring says to (each rank its own XML)."""
    with open(os.path.join(workdir, path), errors="replace") as f:
        launcher = _TORCHRUN.search(f.read())
    pytest = ["-q", "-p", "no:cacheprovider", "-p", "torchneuron_launcher_shim", path]
    if launcher is None:
        return [sys.executable, "-m", "pytest", *pytest, "--junitxml", xml]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={launcher.group(1)}",
            os.path.join(workdir, "torchneuron_rank_pytest.py"), xml, *pytest]


def run_file(workdir: str, out: str, path: str, timeout: float) -> dict:
    """One file's outcome: its tests' results from the JUnit XML, or why it did not run."""
    xml = os.path.join(out, "xml", path.replace("/", "__") + ".xml")
    # TorchNeuron's tests are written for its CI's trn2.48xlarge (NEURON_RT_NUM_CORES=8 in test_multi_device,
    # 128 cores at LNC=1): the emulated instance is that one unless the caller chose another.
    env = {"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", **os.environ,
           "PYTHONPATH": os.pathsep.join([workdir, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(command(workdir, path, xml), cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=timeout)
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as expired:
        output = f"timed out after {timeout:g} s\n{expired.stdout or ''}"
        return {"file": path, "status": "timeout", "seconds": timeout, "tests": [], "detail": output[-2000:]}
    tests = read_junit(xml)
    collection = [t for t in tests if t["name"].startswith("::")]  # the file's own error: no class, no test
    result = {"file": path, "seconds": time.perf_counter() - start, "tests": [t for t in tests if t not in collection]}
    result["status"] = "ran" if result["tests"] else "not imported" if collection or "rror" in output else "empty"
    if result["status"] == "not imported":
        missing = _MISSING.findall(output)
        result["detail"] = (": ".join(missing[-1]) if missing else output.strip().splitlines()[-1:][0])[:300]
    return result


def read_junit(xml: str) -> list[dict]:
    """The tests of a file's JUnit XML, or of its ranks' (a test fails if it fails on any rank)."""
    paths = [xml] if os.path.exists(xml) else sorted(
        os.path.join(os.path.dirname(xml), n) for n in os.listdir(os.path.dirname(xml))
        if n.startswith(os.path.basename(xml) + ".rank"))
    merged: dict[str, dict] = {}
    order = {"failed": 3, "passed": 2, "xfailed": 1, "skipped": 0}
    for path in paths:
        for test in _read_one(path):
            known = merged.get(test["name"])
            if known is None or order[test["outcome"]] > order[known["outcome"]]:
                merged[test["name"]] = test
    return list(merged.values())


def _read_one(xml: str) -> list[dict]:
    try:
        root = ElementTree.parse(xml).getroot()
    except (OSError, ElementTree.ParseError):
        return []
    tests = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}[child.tag]
                if child.tag == "skipped" and "xfail" in (child.get("type") or "") + (child.get("message") or ""):
                    outcome = "xfailed"
                lines = (child.get("message") or child.text or "").strip().splitlines()[:1]
                message = lines[0][:300] if lines else ""
        tests.append({"name": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome,
                      "message": message})
    return tests


def folder_of(path: str, folders) -> str:
    inside = os.path.relpath(path, "tests")
    return max((f for f in folders if inside.startswith(f + "/")), key=len, default=inside.split("/")[0])


def summarize(results: list[dict], folders) -> tuple[str, list[str]]:
    """A Markdown table of counts per folder, and a line per failure."""
    counts = collections.defaultdict(collections.Counter)
    failures = []
    for r in results:
        folder = folder_of(r["file"], folders)
        counts[folder]["files"] += 1
        if r["status"] != "ran":
            counts[folder][r["status"]] += 1
            failures.append(f"{r['file']}: {r['status']}: {r.get('detail', '')}".strip())
        for t in r["tests"]:
            counts[folder][t["outcome"]] += 1
            if t["outcome"] == "failed":
                failures.append(f"{r['file']}::{t['name'].split('::')[-1]}: {t['message']}")
    columns = ("files", "passed", "failed", "skipped", "xfailed", "not imported", "timeout")
    rows = [f"| {folder} | " + " | ".join(str(counts[folder][c]) for c in columns) + " |" for folder in counts]
    total = sum((counts[f] for f in counts), collections.Counter())
    ran = total["passed"] + total["failed"]
    rows.append("| **all** | " + " | ".join(str(total[c]) for c in columns) + " |")
    table = ["| folder | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns), *rows, "",
             f"{total['passed']} of {ran} tests that ran passed ({100 * total['passed'] / max(ran, 1):.1f}%)."]
    return "\n".join(table), failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", required=True, help="TorchNeuron's repository: a work tree or a bare git dir")
    parser.add_argument("--folders", default=",".join(FOLDERS), help="folders under tests/, comma-separated")
    parser.add_argument("--files", help="only files whose path matches this regular expression")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per file")
    parser.add_argument("--jobs", type=int, default=2, help="files at once")
    parser.add_argument("--out", default="torchneuron-suite", help="where the results go")
    options = parser.parse_args(argv)
    folders = tuple(f.strip().strip("/") for f in options.folders.split(",") if f.strip())
    os.makedirs(os.path.join(options.out, "xml"), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="torchneuron-suite-") as workdir:
        commit = export(os.path.abspath(options.checkout), workdir)
        files = test_files(workdir, folders, options.files)
        print(f"TorchNeuron {commit[:12]}: {len(files)} files", file=sys.stderr, flush=True)
        with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
            futures = [pool.submit(run_file, workdir, os.path.abspath(options.out), f, options.timeout) for f in files]
            results = []
            for future in concurrent.futures.as_completed(futures):
                results.append(future.result())
                r = results[-1]
                print(f"  {r['file']}: {r['status']}, {collections.Counter(t['outcome'] for t in r['tests'])}",
                      file=sys.stderr, flush=True)
    results.sort(key=lambda r: r["file"])
    table, failures = summarize(results, folders)
    with open(os.path.join(options.out, "summary.md"), "w") as f:
        f.write(f"TorchNeuron commit {commit}\n\n{table}\n")
    with open(os.path.join(options.out, "failures.txt"), "w") as f:
        f.write("\n".join(failures) + "\n")
    with open(os.path.join(options.out, "results.json"), "w") as f:
        json.dump({"commit": commit, "results": results}, f, indent=1)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
