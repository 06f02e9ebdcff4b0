"""The seed's compiled program (examples/compiled_neuron.py, with each executor) and the main job
(torch_neuronx.demo) on the small Flux2-Klein pipeline built in code: compiled equals eager equals
CPU, and the main job compiles only when shapes change."""
import json
import os
import re

import numpy as np
import pytest

from helpers import seed_examples
from helpers.seed_examples import PIXEL_TOLERANCE, ROOT, example, program

README = os.path.join(ROOT, "README.md")


@pytest.fixture(scope="module")
def neff_cache(tmp_path_factory):
    """One compile cache for this module: the main job's first compile is the compiled program's."""
    return str(tmp_path_factory.mktemp("neff"))


@pytest.fixture(scope="module")
def cpu_image():
    return seed_examples.cpu_image()


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
def test_compiled_program_draws_what_eager_draws(tmp_path, cpu_image, neff_cache):
    image = example("compiled_neuron.py", tmp_path, TORCH_NEURONX_NEFF_CACHE_DIR=neff_cache)
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE


@pytest.mark.long  # half a minute of compiling: make test-long (CI runs it; make test stays under 10 minutes)
def test_compiled_program_draws_what_eager_draws_as_torchneuron_lowers_it(tmp_path, cpu_image, neff_cache):
    """The xla executor: TorchNeuron's StableHLO program of the transformer, run by XLA:CPU."""
    image = example("compiled_neuron.py", tmp_path, TORCH_NEURONX_NEFF_CACHE_DIR=neff_cache,
                    TORCH_NEURONX_COMPILE_EXECUTOR="xla")
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
def test_main_job_reports_each_phase_and_compiles_only_when_shapes_change(tmp_path, neff_cache):
    """`make demo` as it runs (512x512, 4 steps): its phases, its report, and the README's excerpt of it."""
    report = tmp_path / "phases.json"
    r = program(["-m", "torch_neuronx.demo", "--output", str(tmp_path / "out.png"), "--json", str(report)],
                tmp_path, TORCH_NEURONX_NEFF_CACHE_DIR=neff_cache)
    phases = {p["name"]: p for p in json.loads(report.read_text())}
    graphs = {name: p["graphs"] for name, p in phases.items()}
    assert graphs == {
        "cpu eager (the oracle)": None, "neuron eager": None, "cpu compiled (Inductor)": None,
        "neuron compiled, warm-up": 1, "neuron compiled, second call": 0,
        "neuron compiled, new size": 1, "neuron compiled, other step count": 0,
        "cpu repeated blocks (Inductor)": None,
        "repeated blocks compiled, warm-up": 2, "repeated blocks compiled, call": 0,
    }, graphs
    assert phases["neuron eager"]["difference"].endswith("vs cpu")
    for name in ("neuron compiled, warm-up", "neuron compiled, second call", "repeated blocks compiled, call"):
        assert phases[name]["difference"].endswith("vs inductor"), phases[name]  # a compiled graph's oracle
    assert "emulated trn2.3xlarge" in r.stdout and "memory peak on neuron:0" in r.stdout, r.stdout
    assert re.search(r"pipeline on neuron:0: [\d.]+ MiB of device memory; this host: \S+ \S+ of this process's "
                     r"own, \S+ \S+ of checkpoint file pages it maps", r.stdout), r.stdout
    assert (tmp_path / "out.png").stat().st_size > 0
    # The readiness report of one eager and one compiled generation, printed and written.
    assert "Trainium readiness report" in r.stdout and "ESTIMATED time on Trainium2" in r.stdout
    readiness = json.loads((tmp_path / "neuron_report" / "report.json").read_text())
    by_phase = {p["name"]: p for p in readiness["phases"]}
    assert by_phase["eager generation"]["eager_calls"] > 100 and by_phase["eager generation"]["estimated_ms"] > 0
    assert by_phase["compiled generation"]["compiled_graph_calls"] == 4  # one per denoising step
    assert [g["calls"] for g in readiness["compiled_graphs"]] == [4] and not readiness["compiled_graphs"][0]["error"]
    assert (tmp_path / "neuron_report" / "report.html").stat().st_size > 0
    head, rest = readme_demo_excerpt()
    printed = r.stdout.splitlines()
    start = printed.index(next(line for line in printed if line.startswith("Trainium readiness report")))
    # The head line for line (the process id aside), then the lines after "..." in the order printed.
    pid = re.compile(r"pid \d+")
    assert [pid.sub("pid N", line) for line in printed[start:start + len(head)]] == [pid.sub("pid N", line)
                                                                                     for line in head]
    after = printed[start + len(head):]
    assert all(line in after for line in rest) and [after.index(line) for line in rest] == \
        sorted(after.index(line) for line in rest), rest


@pytest.mark.long  # minutes of compiling: make test-long (CI runs it)
def test_main_job_in_bf16_checks_compiled_images_against_inductor_on_cpu(tmp_path, neff_cache):
    """A bf16 checkpoint (`--model`, as the real one and real-size-random): compiled code fuses and rounds
    otherwise than eager (by 0.05 at 128x128, 2 steps), so each compiled phase's oracle is Inductor's on CPU, not eager."""
    from torch_neuronx.demo.pipelines import tiny_flux2_klein_path

    report = tmp_path / "phases.json"
    r = program(["-m", "torch_neuronx.demo", "--model", tiny_flux2_klein_path(), "--height", "64", "--width", "64",
                 "--steps", "1", "--max-sequence-length", "64", "--output", str(tmp_path / "out.png"),
                 "--json", str(report)], tmp_path, TORCH_NEURONX_NEFF_CACHE_DIR=neff_cache)
    assert "bfloat16" in r.stdout.splitlines()[0], r.stdout
    phases = {p["name"]: p for p in json.loads(report.read_text())}
    checked = {name: p["difference"] for name, p in phases.items() if p["difference"]}
    assert checked.keys() == {"neuron eager", "neuron compiled, warm-up", "neuron compiled, second call",
                              "repeated blocks compiled, warm-up", "repeated blocks compiled, call"}, checked
    # the demo exits on a difference over its tolerance; neuron's compiled code is Inductor's, on the same bytes
    assert all(float(d.split()[0]) <= 2e-3 for d in checked.values()), checked


def readme_demo_excerpt() -> tuple[list[str], list[str]]:
    """The README's excerpt of the demo's report: (its lines up to "  ...", the lines after)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    block = text[text.index("The demo's report (`make demo`"):].split("```\n")[1]
    head, _, rest = block.partition("\n  ...\n")
    return head.splitlines(), rest.splitlines()


def test_the_readme_demo_excerpt_is_a_report_head():
    """The excerpt starts as a report does and marks where it is cut (the demo's run checks its lines)."""
    head, rest = readme_demo_excerpt()
    assert head[0].startswith("Trainium readiness report") and head[1].startswith("Verdict (")
    assert rest and rest[0].startswith("What ran on neuron")
