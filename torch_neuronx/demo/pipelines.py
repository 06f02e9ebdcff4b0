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
import os
import shutil
import tempfile

import torch

REAL_MODEL = "black-forest-labs/FLUX.2-klein-4B"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# Qwen3's chat template, reduced to what the pipeline uses (it asks for enable_thinking=False).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
TEXT_HIDDEN = 32


def byte_level_tokenizer():
    """A Qwen2 fast tokenizer over the 256 byte symbols (no merges) and Qwen3's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({token: len(vocab) + i for i, token in enumerate(SPECIAL_TOKENS)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = Qwen2TokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, additional_special_tokens=list(SPECIAL_TOKENS[1:]))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


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
    if os.path.isfile(os.path.join(directory, "model_index.json")):
        return directory
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(directory))
    try:
        tiny_flux2_klein().save_pretrained(staging)
        try:
            os.rename(staging, directory)
        except OSError:  # another process got there first, or a stale, broken copy is in the way
            if not os.path.isfile(os.path.join(directory, "model_index.json")):
                shutil.rmtree(directory, ignore_errors=True)
                os.rename(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


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


def model_source(model: str | None) -> tuple[str, torch.dtype]:
    """What to pass to ``Flux2KleinPipeline.from_pretrained``: (path or hub id, dtype)."""
    if model is None:
        return tiny_flux2_klein_path(), torch.float32
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
    if os.path.exists(model) or not looks_like_hub_id:
        if not os.path.isdir(model):
            raise ModelNotFoundError(f"--model {model}: no such directory, and not a hub id like {REAL_MODEL}.")
        _check_local_model(model)
        return model, torch.bfloat16
    try:  # a hub id: only from the local cache, since there may be no network
        from huggingface_hub import snapshot_download

        path = snapshot_download(model, local_files_only=True)
    except Exception as error:
        raise ModelNotFoundError(
            f"--model {model}: not in the local Hugging Face cache ({type(error).__name__}). Download it first "
            f"(`huggingface-cli download {model}`) or pass a local directory.") from error
    _check_local_model(path)
    return path, torch.bfloat16


def argument_parser(description: str) -> argparse.ArgumentParser:
    """The options every seed program takes; the defaults are the seed's."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", metavar="PATH_OR_HUB_ID",
                        help=f"a Flux2-Klein checkpoint (e.g. {REAL_MODEL}, from the local cache) in bf16; "
                             "default: a small pipeline built in code")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4, help="num_inference_steps")
    parser.add_argument("--output", default="output.png")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before the run")
    return parser
