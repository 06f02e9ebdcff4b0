"""Where the seed's programs get their Flux2-Klein pipeline: by default a small one built in code
(random weights, a byte-level tokenizer, no network), saved once with ``save_pretrained`` so it
loads with ``from_pretrained(path)`` like the real one; or, with ``--model``, a real checkpoint
(``black-forest-labs/FLUX.2-klein-4B`` or any Flux2-Klein in the local Hugging Face cache) in bf16.

The small pipeline keeps the real one's structure and the seed's defaults working: its text
encoder has 28 layers, so the pipeline's ``text_encoder_out_layers=(9, 18, 27)`` exist, and
``joint_attention_dim`` is 3 x its hidden size, as the three stacked layers require.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import tempfile

import torch

from torch_neuronx.demo import real_size
from torch_neuronx.demo.publish import publish_once
from torch_neuronx.demo.tokenizer import byte_level_tokenizer
from torch_neuronx.runtime import checkpoint_pages, host_memory
from torch_neuronx.runtime.units import format_bytes

REAL_MODEL = "black-forest-labs/FLUX.2-klein-4B"
TEXT_HIDDEN = 32


def tiny_flux2_klein(seed: int = 0):
    """A Flux2KleinPipeline with every component small and random (~360k parameters)."""
    from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline,
                           Flux2Transformer2DModel)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    tokenizer = byte_level_tokenizer()
    text_encoder = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=28,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
        tie_word_embeddings=True))
    vae = AutoencoderKLFlux2(
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, latent_channels=4, norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        mid_block_add_attention=False)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=4 * 4, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=3 * TEXT_HIDDEN, timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
    return Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=transformer, is_distilled=True)


def tiny_flux2_klein_path(directory: str | None = None) -> str:
    """The small pipeline saved with save_pretrained (built on first use; safe when several
    processes, e.g. torchrun's ranks, ask at once: each saves aside, one rename wins)."""
    import diffusers

    if directory is None:
        directory = os.path.join(tempfile.gettempdir(), "torch_neuronx_demo", f"tiny-flux2-klein-{diffusers.__version__}")
    return publish_once(directory, "model_index.json", lambda staging: tiny_flux2_klein().save_pretrained(staging))


class ModelNotFoundError(FileNotFoundError):
    """``--model`` names no Flux2-Klein checkpoint that can be loaded here."""


def _check_local_model(path: str) -> None:
    weights = [f for _, _, files in os.walk(os.path.join(path, "transformer")) for f in files
               if f.endswith((".safetensors", ".bin"))]
    if not os.path.isfile(os.path.join(path, "model_index.json")) or not weights:
        raise ModelNotFoundError(
            f"--model {path}: this directory has no Flux2-Klein weights (it needs model_index.json and "
            f"transformer/*.safetensors, as `huggingface-cli download {REAL_MODEL} --local-dir {path}` "
            "writes them). Leave --model out to use the small pipeline built in code.")


def model_source(model: str | None, sharded: tuple[str, ...] = ()) -> tuple[str, torch.dtype]:
    """What to pass to ``Flux2KleinPipeline.from_pretrained``: (path or hub id, dtype). A checkpoint
    on disk is first checked against this host's memory, for as many processes of the program as
    torchrun starts here, each holding its share of the ``sharded`` components and all of the rest."""
    if model is None:
        return tiny_flux2_klein_path(), torch.float32
    if model == real_size.NAME:
        path = real_size.real_size_random_path()
        check_fits_host(path, sharded)
        return path, torch.bfloat16
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
    if os.path.exists(model) or not looks_like_hub_id:
        if not os.path.isdir(model):
            raise ModelNotFoundError(f"--model {model}: no such directory, and not a hub id like {REAL_MODEL}.")
        _check_local_model(model)
        check_fits_host(model, sharded)
        return model, torch.bfloat16
    try:  # a hub id: only from the local cache, since there may be no network
        from huggingface_hub import snapshot_download

        path = snapshot_download(model, local_files_only=True)
    except Exception as error:
        raise ModelNotFoundError(
            f"--model {model}: not in the local Hugging Face cache ({type(error).__name__}). Download it first "
            f"(`huggingface-cli download {model}`) or pass a local directory.") from error
    _check_local_model(path)
    check_fits_host(path, sharded)
    return path, torch.bfloat16


def _component_bytes(path: str) -> dict[str, int]:
    """The bytes of each component's weight files: what a process holds once it is loaded."""
    sizes = {}
    for component in sorted(os.listdir(path)):
        folder = os.path.join(path, component)
        if os.path.isdir(folder):
            sizes[component] = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder)
                                   for f in files if f.endswith((".safetensors", ".bin")))
    return sizes


def check_fits_host(path: str, sharded: tuple[str, ...] = ()) -> None:
    """Raise HostMemoryError before loading when the processes of this host cannot all hold their part.
    A component loaded whole stays in its checkpoint's pages, which every process maps (moving it to
    neuron maps them again): counted once for the host. A rank's shard is its own memory."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sizes = _component_bytes(path)
    mapped = checkpoint_pages.enabled()
    per_process = sum(size // world if name in sharded else 0 if mapped else size for name, size in sizes.items())
    shared = sum(size for name, size in sizes.items() if name not in sharded) if mapped else 0
    parts = ", ".join(f"{name} {format_bytes(size)}" + (f" / {world} ranks" if name in sharded else
                                                         " shared" if mapped else "")
                      for name, size in sizes.items() if size)
    host_memory.require(processes * per_process + shared,
                        f"loading {path} ({parts}) in {processes} process(es) on this host",
                        "run fewer processes on this host (torchrun --nproc_per_node), shard more of the model, "
                        "use a host with more memory, or leave --model out for the small pipeline")


@contextlib.contextmanager
def cpu_computing_as_neuron():
    """Inside this block CPU computes float64 and int64 as diffusers computes them on neuron: as float32 and
    int32 (Trainium has neither; ``maybe_adjust_dtype_for_device``), e.g. the rotary embedding's angles. The
    oracle a neuron image is compared with: in bf16 that last-bit difference grows over the denoising steps
    into differing pixels."""
    from diffusers.utils import torch_utils

    saved = torch_utils._DTYPE_UNSUPPORTED_DEVICES
    torch_utils._DTYPE_UNSUPPORTED_DEVICES = {dtype: devices | {"cpu"} for dtype, devices in saved.items()}
    try:
        yield
    finally:
        torch_utils._DTYPE_UNSUPPORTED_DEVICES = saved


def argument_parser(description: str) -> argparse.ArgumentParser:
    """The options every seed program takes; the defaults are the seed's."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", metavar="PATH_OR_HUB_ID",
                        help=f"a Flux2-Klein checkpoint (e.g. {REAL_MODEL}, from the local cache) in bf16, or "
                             f"{real_size.NAME} (that model's configs with random weights, built in code and "
                             "saved once, 16 GB); default: a small pipeline built in code")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4, help="num_inference_steps")
    parser.add_argument("--output", default="output.png")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before the run")
    return parser
