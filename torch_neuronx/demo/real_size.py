"""FLUX.2-klein-4B at its real size with random weights, built in code (no network).

The configs are the checkpoint's: a 3.88B-parameter transformer (5 double and 20 single blocks,
24 heads of 128, 128 latent channels, text features 3 x 2560), a Qwen3-4B text encoder and the
default ``AutoencoderKLFlux2``: 8.4B parameters, 16.7 GB in bfloat16. Only the tokenizer is the
small pipeline's byte-level one (its ids are a subset of Qwen3's vocabulary).

Each component is created with its parameters on the meta device (buffers such as rotary
frequencies are computed as usual), then every parameter is allocated once in bfloat16 and
filled: norms' scales 1, biases 0, every other weight from a pool of 2^24 normal draws (std 0.02)
copied from a random start, so filling runs at memory speed; one seeded generator per component. ``depth`` shrinks the number of blocks and layers at the real widths, for the suite.

``real_size_random_path()`` saves the pipeline once with ``save_pretrained`` (component by
component, so the host holds one component at a time), for ``from_pretrained`` as the seed loads it.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

import torch

from torch_neuronx.demo.publish import publish_once
from torch_neuronx.runtime import host_memory

NAME = "real-size-random"
WEIGHT_STD = 0.02
# Normal draws every weight is copied from (a prime count, so windows of rows do not line up).
POOL_SIZE = 16_777_259
COMPONENTS = ("text_encoder", "transformer", "vae")


@dataclass(frozen=True)
class Depth:
    """How many blocks each stack has: the checkpoint's by default."""
    double_blocks: int = 5
    single_blocks: int = 20
    text_layers: int = 36

    @property
    def is_real(self) -> bool:
        return self == Depth()



def text_encoder_out_layers(text_layers: int) -> tuple[int, ...]:
    """The three hidden states the pipeline stacks: its default (9, 18, 27) from 28 layers on, else the last
    three (index 0 is the embedding's output)."""
    if text_layers >= 28:
        return (9, 18, 27)
    return tuple(max(0, text_layers - k) for k in (2, 1, 0))


TRANSFORMER_CONFIG = dict(
    patch_size=1, in_channels=128, attention_head_dim=128, num_attention_heads=24, joint_attention_dim=7680,
    timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32), rope_theta=2000,
    eps=1e-6, guidance_embeds=False)
TEXT_ENCODER_CONFIG = dict(
    vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True)


def _transformer(depth: Depth):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(num_layers=depth.double_blocks, num_single_layers=depth.single_blocks,
                                   **TRANSFORMER_CONFIG)


def _text_encoder(depth: Depth):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(num_hidden_layers=depth.text_layers, **TEXT_ENCODER_CONFIG)
    config.dtype = torch.bfloat16  # written to config.json, as the checkpoint's says
    return Qwen3ForCausalLM(config)


def _vae(depth: Depth):
    from diffusers import AutoencoderKLFlux2

    return AutoencoderKLFlux2()


BUILDERS = {"text_encoder": _text_encoder, "transformer": _transformer, "vae": _vae}


def _meta_component(name: str, depth: Depth) -> torch.nn.Module:
    """The component with meta parameters (its buffers, such as rotary frequencies, computed on the host)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        module = BUILDERS[name](depth)
    _tie(module)
    return module


def _tie(module: torch.nn.Module) -> None:
    if hasattr(module, "tie_weights"):  # Qwen3-4B's head is its embedding, which meta construction untied
        module.tie_weights()


def _normal_pool(generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(POOL_SIZE, dtype=dtype).normal_(0.0, WEIGHT_STD, generator=generator)


def _fill_from_pool(value: torch.Tensor, pool: torch.Tensor, generator: torch.Generator) -> None:
    """Copy windows of the pool, from a random start, over ``value``: memory-bound, not RNG-bound."""
    flat, done = value.view(-1), 0
    start = int(torch.randint(POOL_SIZE, (), generator=generator))
    while done < flat.numel():
        count = min(POOL_SIZE - start, flat.numel() - done)
        flat[done:done + count].copy_(pool[start:start + count])
        done, start = done + count, 0


def _fill(module: torch.nn.Module, generator: torch.Generator, dtype: torch.dtype) -> None:
    """Give every meta parameter host memory of ``dtype`` and a value (shared ones once)."""
    pool = _normal_pool(generator, dtype)
    done: dict[int, torch.nn.Parameter] = {}
    for submodule in module.modules():
        for name, param in list(submodule._parameters.items()):
            if param is None:
                continue
            if id(param) in done:
                submodule._parameters[name] = done[id(param)]
                continue
            value = torch.empty(param.shape, dtype=dtype)
            if name == "bias":
                value.zero_()
            elif param.dim() == 1:  # the scales of norms (and the VAE's batch norm)
                value.fill_(1.0)
            else:
                _fill_from_pool(value, pool, generator)
            done[id(param)] = submodule._parameters[name] = torch.nn.Parameter(value, requires_grad=False)


def build_component(name: str, depth: Depth = Depth(), seed: int = 0, dtype: torch.dtype = torch.bfloat16):
    """One component with random weights, on the host."""
    module = _meta_component(name, depth)
    host_memory.require(_meta_bytes(module, dtype), f"building the {NAME} {name}",
                        "build a smaller depth (Depth(...)), or free host memory")
    generator = torch.Generator().manual_seed(seed + COMPONENTS.index(name))
    _fill(module, generator, dtype)
    _tie(module)
    return module.eval()


def _meta_bytes(module: torch.nn.Module, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() for p in module.parameters()) * itemsize


def _scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)


def _meta_pipeline(depth: Depth):
    """The pipeline with meta parameters only: for its model_index.json, never for running."""
    from diffusers import Flux2KleinPipeline

    from torch_neuronx.demo.tokenizer import byte_level_tokenizer

    models = {name: _meta_component(name, depth) for name in COMPONENTS}
    return Flux2KleinPipeline(scheduler=_scheduler(), tokenizer=byte_level_tokenizer(), is_distilled=True, **models)


def _save(directory: str, depth: Depth, seed: int) -> None:
    """Save component by component, so the host holds one at a time."""
    pipe = _meta_pipeline(depth)
    pipe.save_config(directory)  # model_index.json, as save_pretrained writes it
    pipe.tokenizer.save_pretrained(os.path.join(directory, "tokenizer"))
    pipe.scheduler.save_pretrained(os.path.join(directory, "scheduler"))
    for name in COMPONENTS:
        module = build_component(name, depth, seed)
        module.save_pretrained(os.path.join(directory, name))
        del module
    with open(os.path.join(directory, "real_size.json"), "w") as f:
        json.dump({"depth": depth.__dict__, "seed": seed, "weight_std": WEIGHT_STD}, f)


def checkpoint_bytes(depth: Depth = Depth(), dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """The bytes of each component's weights, counted on the meta device (nothing allocated)."""
    return {name: _meta_bytes(_meta_component(name, depth), dtype) for name in COMPONENTS}


def default_directory(depth: Depth = Depth()) -> str:
    import diffusers

    suffix = "" if depth.is_real else f"-d{depth.double_blocks}-s{depth.single_blocks}-t{depth.text_layers}"
    return os.path.join(tempfile.gettempdir(), "torch_neuronx_demo", f"{NAME}{suffix}-{diffusers.__version__}")


def real_size_random_path(directory: str | None = None, depth: Depth = Depth(), seed: int = 0) -> str:
    """The pipeline saved with save_pretrained (built on first use, in a staging directory that one
    rename publishes, so concurrent callers and an interrupted build leave no half-written copy)."""
    directory = directory or default_directory(depth)

    def write(staging):
        host_memory.require_disk(os.path.dirname(staging), sum(checkpoint_bytes(depth).values()),
                                 f"saving the {NAME} pipeline",
                                 "point TMPDIR (or the directory argument) at a disk with room")
        _save(staging, depth, seed)
    return publish_once(directory, "real_size.json", write)
