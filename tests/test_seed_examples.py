"""The seed's eager and tensor-parallel programs (examples/) and the main job's tensor-parallel run
(torch_neuronx.demo --tp) on the small Flux2-Klein pipeline built in code, each checked against
plain PyTorch on CPU: eager equals CPU, tensor parallel equals one core; and the --model option.
The compiled programs are in test_seed_examples_compiled.py (a file of their own, so that another
worker can run them meanwhile)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import seed_examples
from helpers.isolated import environment, run
from helpers.seed_examples import PIXEL_TOLERANCE, ROOT, SIZE, example, program


@pytest.fixture(scope="module")
def cpu_image():
    return seed_examples.cpu_image()


def test_eager_program_draws_what_cpu_draws(tmp_path, cpu_image):
    image = example("eager_neuron.py", tmp_path)
    assert image.shape == (128, 128, 3) and image.std() > 5  # a picture, not a blank
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE


def test_tensor_parallel_program_on_two_cores_draws_what_one_core_draws(tmp_path, cpu_image):
    script = os.path.join(ROOT, "examples", "tensor_parallel_neuron.py")
    r = program(["-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=localhost:0", script, *SIZE, "--output", str(tmp_path / "tp.png")], tmp_path)
    image = np.asarray(Image.open(tmp_path / "tp.png"), dtype=np.int16)
    assert np.abs(image - cpu_image).max() <= PIXEL_TOLERANCE
    for rank in (0, 1):  # each rank says what the host holds for it: its own memory, the shared file pages
        assert re.search(rf"rank {rank}: host memory \S+ \S+ of its own, \S+ \S+ of shared file pages", r.stdout), r.stdout
    # bench_real_size.py --parts tp-program reads these lines: each rank on its own core, its figures in bytes
    ranks = seed_examples.benchmark_module("real_size_report").tp_program_ranks(r.stdout)
    assert sorted(ranks) == [0, 1] and [ranks[k]["core"] for k in (0, 1)] == [0, 1], r.stdout
    for v in ranks.values():  # once loaded and at the end
        assert v["own_loaded"] > 1e8 and v["own_end"] > 1e8 and v["shared_end"] > 0, ranks
        assert 0 < v["core_loaded"] < v["core_peak"], ranks


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
def test_main_job_relaunches_itself_under_torchrun_for_tensor_parallel(tmp_path):
    r = program(["-m", "torch_neuronx.demo", *SIZE, "--steps", "2", "--tp", "2", "--output",
                 str(tmp_path / "tp.png")], tmp_path)
    assert "tensor parallel over 2 cores" in r.stdout and "vs one core" in r.stdout, r.stdout
    assert (tmp_path / "tp.png").exists()
    # each rank's peak on its own core, neuron:<LOCAL_RANK> (rank 1's is not its empty neuron:0)
    peaks = re.search(r"memory peak per core: rank 0 (\S+) \S+, rank 1 (\S+) \S+", r.stdout)
    assert peaks and float(peaks.group(1)) > 0 and float(peaks.group(2)) > 0, r.stdout


@pytest.mark.long  # a child process loading diffusers: make test-long (CI runs it; make test stays under 10 minutes)
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


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_model_option_loads_a_checkpoint_directory_in_bf16_as_for_the_real_model(tmp_path):
    # The small pipeline's directory stands in for a downloaded FLUX.2-klein: the --model path
    # (a local checkpoint, bf16) runs end to end and draws what CPU draws in bf16.
    from diffusers import Flux2KleinPipeline

    from torch_neuronx.demo.pipelines import cpu_computing_as_neuron, model_source, tiny_flux2_klein_path

    path = tiny_flux2_klein_path()
    assert model_source(path) == (path, torch.bfloat16)
    image = example("eager_neuron.py", tmp_path, "--model", path)
    pipe = Flux2KleinPipeline.from_pretrained(path, dtype=torch.bfloat16)
    torch.manual_seed(0)
    with cpu_computing_as_neuron():  # diffusers narrows float64 on neuron by design: the oracle does too
        cpu = np.asarray(pipe(prompt="a golden retriever surfing a wave, photorealistic", height=128, width=128,
                              num_inference_steps=4).images[0], dtype=np.int16)
    assert np.abs(image - cpu).max() <= PIXEL_TOLERANCE
