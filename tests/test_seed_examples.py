"""The seed's three programs (examples/) and the main job (torch_neuronx.demo) on the small
Flux2-Klein pipeline built in code, each checked against plain PyTorch on CPU: eager equals CPU,
compiled equals eager, tensor parallel equals one core."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.isolated import environment, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = ["--height", "128", "--width", "128"]
PIXEL_TOLERANCE = 2  # out of 255: PNG rounding of float32 results that differ in the last bits


def program(args, cwd, **env):
    r = subprocess.run([sys.executable, *args], cwd=cwd, env=environment(**env), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


def example(name, tmp_path, *extra, **env):
    program([os.path.join(ROOT, "examples", name), *SIZE, "--output", str(tmp_path / f"{name}.png"), *extra],
            tmp_path, **env)
    return np.asarray(Image.open(tmp_path / f"{name}.png"), dtype=np.int16)


@pytest.fixture(scope="module")
def neff_cache(tmp_path_factory):
    """One compile cache for this module: the main job's first compile is the compiled program's."""
    return str(tmp_path_factory.mktemp("neff"))


@pytest.fixture(scope="module")
def cpu_image(tmp_path_factory):
    """What plain PyTorch on CPU draws with the seed's prompt and the examples' seed (0)."""
    from diffusers import Flux2KleinPipeline

    from torch_neuronx.demo.pipelines import tiny_flux2_klein_path

    pipe = Flux2KleinPipeline.from_pretrained(tiny_flux2_klein_path())
    torch.manual_seed(0)
    image = pipe(prompt="a golden retriever surfing a wave, photorealistic", height=128, width=128,
                 num_inference_steps=4).images[0]
    return np.asarray(image, dtype=np.int16)


def test_eager_program_draws_what_cpu_draws(tmp_path, cpu_image):
    image = example("eager_neuron.py", tmp_path)
    assert image.shape == (128, 128, 3) and image.std() > 5  # a picture, not a blank
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE


def test_compiled_program_draws_what_eager_draws(tmp_path, cpu_image, neff_cache):
    image = example("compiled_neuron.py", tmp_path, TORCH_NEURONX_NEFF_CACHE_DIR=neff_cache)
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE


def test_compiled_program_draws_what_eager_draws_as_torchneuron_lowers_it(tmp_path, cpu_image, neff_cache):
    """The xla executor: TorchNeuron's StableHLO program of the transformer, run by XLA:CPU."""
    image = example("compiled_neuron.py", tmp_path, TORCH_NEURONX_NEFF_CACHE_DIR=neff_cache,
                    TORCH_NEURONX_COMPILE_EXECUTOR="xla")
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE


def test_tensor_parallel_program_on_two_cores_draws_what_one_core_draws(tmp_path, cpu_image):
    script = os.path.join(ROOT, "examples", "tensor_parallel_neuron.py")
    program(["-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
             "--rdzv-endpoint=localhost:0", script, *SIZE, "--output", str(tmp_path / "tp.png")], tmp_path)
    image = np.asarray(Image.open(tmp_path / "tp.png"), dtype=np.int16)
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE


def test_main_job_reports_each_phase_and_compiles_only_when_shapes_change(tmp_path, neff_cache):
    report = tmp_path / "phases.json"
    r = program(["-m", "torch_neuronx.demo", *SIZE, "--steps", "2", "--output", str(tmp_path / "out.png"),
                 "--json", str(report)], tmp_path, TORCH_NEURONX_NEFF_CACHE_DIR=neff_cache)
    phases = {p["name"]: p for p in json.loads(report.read_text())}
    graphs = {name: p["graphs"] for name, p in phases.items()}
    assert graphs == {
        "cpu eager (the oracle)": None, "neuron eager": None,
        "neuron compiled, warm-up": 1, "neuron compiled, second call": 0,
        "neuron compiled, new size": 1, "neuron compiled, other step count": 0,
        "repeated blocks compiled, warm-up": 2, "repeated blocks compiled, call": 0,
    }, graphs
    assert phases["neuron eager"]["difference"].endswith("vs cpu")
    assert phases["neuron compiled, second call"]["difference"].endswith("vs eager")
    assert "emulated trn2.3xlarge" in r.stdout and "memory peak on neuron:0" in r.stdout, r.stdout
    assert (tmp_path / "out.png").stat().st_size > 0
    # The readiness report of one eager and one compiled generation, printed and written.
    assert "Trainium readiness report" in r.stdout and "ESTIMATED time on Trainium2" in r.stdout
    readiness = json.loads((tmp_path / "neuron_report" / "report.json").read_text())
    by_phase = {p["name"]: p for p in readiness["phases"]}
    assert by_phase["eager generation"]["eager_calls"] > 100 and by_phase["eager generation"]["estimated_ms"] > 0
    assert by_phase["compiled generation"]["compiled_graph_calls"] == 2  # one per denoising step
    assert [g["calls"] for g in readiness["compiled_graphs"]] == [2] and not readiness["compiled_graphs"][0]["error"]
    assert (tmp_path / "neuron_report" / "report.html").stat().st_size > 0


def test_main_job_relaunches_itself_under_torchrun_for_tensor_parallel(tmp_path):
    r = program(["-m", "torch_neuronx.demo", *SIZE, "--steps", "2", "--tp", "2", "--output",
                 str(tmp_path / "tp.png")], tmp_path)
    assert "tensor parallel over 2 cores" in r.stdout and "vs one core" in r.stdout, r.stdout
    assert "rank 1" in r.stdout and (tmp_path / "tp.png").exists()


def test_a_model_without_weights_is_a_clear_error(tmp_path):
    cases = {str(tmp_path): "this directory has no Flux2-Klein weights",
             str(tmp_path / "missing"): "no such directory",
             "someone/not-downloaded-flux2": "not in the local Hugging Face cache"}
    for model, expected in cases.items():  # the examples' path: the error propagates
        r = run(f"from torch_neuronx.demo.pipelines import model_source; model_source({model!r})",
                HF_HUB_OFFLINE="1")
        assert r.returncode == 1 and "ModelNotFoundError: --model" in r.stderr and expected in r.stderr, r.stderr
    demo = subprocess.run([sys.executable, "-m", "torch_neuronx.demo", "--model", str(tmp_path)], cwd=tmp_path,
                          env=environment(HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=300)
    assert demo.returncode == 1 and demo.stderr.startswith("error: --model") and "no Flux2-Klein weights" in demo.stderr


def test_model_option_loads_a_checkpoint_directory_in_bf16_as_for_the_real_model(tmp_path, monkeypatch):
    # The small pipeline's directory stands in for a downloaded FLUX.2-klein: the --model path
    # (a local checkpoint, bf16) runs end to end and draws what CPU draws in bf16.
    from diffusers import Flux2KleinPipeline

    from torch_neuronx.demo.pipelines import model_source, tiny_flux2_klein_path

    path = tiny_flux2_klein_path()
    assert model_source(path) == (path, torch.bfloat16)
    image = example("eager_neuron.py", tmp_path, "--model", path)
    pipe = Flux2KleinPipeline.from_pretrained(path, dtype=torch.bfloat16)
    # Diffusers computes differently for neuron by design: float64 and int64 become float32 and
    # int32 (Trainium has neither; `maybe_adjust_dtype_for_device`), e.g. the rotary embedding. In
    # bf16 that last-bit difference grows over the denoising steps into differing pixels, so the
    # oracle is CPU made to narrow the same way.
    from diffusers.utils import torch_utils

    narrowing = torch_utils._DTYPE_UNSUPPORTED_DEVICES
    monkeypatch.setattr(torch_utils, "_DTYPE_UNSUPPORTED_DEVICES",
                        {dtype: devices | {"cpu"} for dtype, devices in narrowing.items()})
    torch.manual_seed(0)
    cpu = np.asarray(pipe(prompt="a golden retriever surfing a wave, photorealistic", height=128, width=128,
                          num_inference_steps=4).images[0], dtype=np.int16)
    assert np.abs(image - cpu).max() <= PIXEL_TOLERANCE
