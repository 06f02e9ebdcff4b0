"""What the tests of the seed's programs share (test_seed_examples*.py, test_real_size.py): running a
program, what plain PyTorch on CPU draws (the oracle), and the benchmarks' modules that measure them."""
import functools
import importlib
import os
import subprocess
import sys

import numpy as np
import torch
from PIL import Image

from helpers.isolated import environment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
SIZE = ["--height", "128", "--width", "128"]
PIXEL_TOLERANCE = 2  # out of 255: PNG rounding of float32 results that differ in the last bits
PROMPT = "a golden retriever surfing a wave, photorealistic"


def program(args, cwd, **env):
    r = subprocess.run([sys.executable, *args], cwd=cwd, env=environment(**env), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


def example(name, tmp_path, *extra, **env):
    program([os.path.join(ROOT, "examples", name), *SIZE, "--output", str(tmp_path / f"{name}.png"), *extra],
            tmp_path, **env)
    return np.asarray(Image.open(tmp_path / f"{name}.png"), dtype=np.int16)


@functools.cache
def cpu_image():
    """What plain PyTorch on CPU draws with the seed's prompt and the examples' seed (0)."""
    from diffusers import Flux2KleinPipeline

    from torch_neuronx.demo.pipelines import tiny_flux2_klein_path

    pipe = Flux2KleinPipeline.from_pretrained(tiny_flux2_klein_path())
    torch.manual_seed(0)
    image = pipe(prompt=PROMPT, height=128, width=128, num_inference_steps=4).images[0]
    return np.asarray(image, dtype=np.int16)


def benchmark_module(name: str):
    """A module beside the benchmarks (they import each other by their plain names)."""
    sys.path.insert(0, BENCHMARKS)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(BENCHMARKS)
