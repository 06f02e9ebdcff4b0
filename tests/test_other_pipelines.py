"""The other pipelines a Trainium user runs, built small in code with random weights: an SDXL-style
UNet pipeline, PixArt-Sigma and QwenImage transformer pipelines, a transformers LLM's `generate`,
and Accelerate's device detection. Each runs on plain PyTorch on CPU (the oracle) and on neuron."""
import copy
import json

import numpy as np
import pytest
import torch

from helpers.isolated import run, torchrun

SIZE = 32  # pixels; the tiny VAEs below halve it once, so latents are 16x16
STEPS = 2


def tiny_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32),
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         norm_num_groups=8, sample_size=SIZE)


def embeddings(*shapes):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(*shape, generator=g) for shape in shapes]


def padding_mask(length, kept):
    mask = torch.ones(1, length, dtype=torch.long)
    mask[:, kept:] = 0
    return mask


def draw_on_cpu_then_neuron(pipe, denoiser, **inputs):
    """The pipeline's images on CPU, then after pipe.to("neuron") with its tensor inputs on neuron;
    also the device types the denoiser saw in the second run (to know it really ran on neuron)."""
    pipe.set_progress_bar_config(disable=True)
    seen = []
    denoiser.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        next(v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)).device.type), with_kwargs=True)

    def draw(device):
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        return pipe(**moved, height=SIZE, width=SIZE, num_inference_steps=STEPS, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images

    cpu_images = draw("cpu")
    assert set(seen) == {"cpu"}
    seen.clear()
    pipe.to("neuron")
    assert pipe.device.type == "neuron"
    neuron_images = draw("neuron")
    assert cpu_images.shape == (1, SIZE, SIZE, 3) and cpu_images.std() > 0.01  # a picture, not a blank
    return cpu_images, neuron_images, set(seen)


def test_sdxl_unet_pipeline_with_guidance_draws_on_neuron_what_cpu_draws():
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    text_dim, pooled_dim, time_dim = 32, 32, 8
    unet = UNet2DConditionModel(
        sample_size=SIZE // 2, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), transformer_layers_per_block=(1, 2), use_linear_projection=True,
        cross_attention_dim=text_dim, norm_num_groups=8,
        # SDXL's micro-conditioning: the pooled text embedding and six size/crop numbers
        addition_embed_type="text_time", addition_time_embed_dim=time_dim,
        projection_class_embeddings_input_dim=pooled_dim + 6 * time_dim)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       timestep_spacing="leading", steps_offset=1)
    pipe = StableDiffusionXLPipeline(vae=tiny_vae(), unet=unet, scheduler=scheduler, text_encoder=None,
                                     text_encoder_2=None, tokenizer=None, tokenizer_2=None)
    prompt, pooled, negative, negative_pooled = embeddings((1, 7, text_dim), (1, pooled_dim),
                                                           (1, 7, text_dim), (1, pooled_dim))
    cpu_images, neuron_images, seen = draw_on_cpu_then_neuron(
        pipe, unet, prompt_embeds=prompt, pooled_prompt_embeds=pooled, negative_prompt_embeds=negative,
        negative_pooled_prompt_embeds=negative_pooled, guidance_scale=5.0)
    assert seen == {"neuron"}
    np.testing.assert_array_equal(neuron_images, cpu_images)


def tiny_pixart_sigma(sample_size):
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    torch.manual_seed(0)
    transformer = PixArtTransformer2DModel(
        sample_size=sample_size, patch_size=2, in_channels=4, out_channels=8, num_layers=2, num_attention_heads=2,
        attention_head_dim=8, cross_attention_dim=16, caption_channels=32, attention_bias=True,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6)
    return PixArtSigmaPipeline(tokenizer=None, text_encoder=None, vae=tiny_vae(), transformer=transformer,
                               scheduler=DPMSolverMultistepScheduler())


def pixart_inputs():
    prompt, negative = embeddings((1, 7, 32), (1, 7, 32))
    # negative_prompt=None: its default "" would need the tokenizer
    return dict(prompt_embeds=prompt, prompt_attention_mask=padding_mask(7, 5), negative_prompt_embeds=negative,
                negative_prompt_attention_mask=padding_mask(7, 7), negative_prompt=None, guidance_scale=4.5,
                use_resolution_binning=False)


def test_pixart_sigma_transformer_pipeline_draws_on_neuron_what_cpu_draws():
    pipe = tiny_pixart_sigma(sample_size=SIZE // 2)  # the latents' own size: the built-in position table is used
    cpu_images, neuron_images, seen = draw_on_cpu_then_neuron(pipe, pipe.transformer, **pixart_inputs())
    assert seen == {"neuron"}
    np.testing.assert_array_equal(neuron_images, cpu_images)


def test_pixart_sigma_away_from_its_native_size_differs_only_by_diffusers_float32_position_table():
    """At another size than sample_size, PixArt recomputes its sin-cos position table on the latents'
    device, and diffusers computes it in float64 except on devices it lists as without float64 (mps,
    npu, neuron: utils/torch_utils.py _FP64_UNSUPPORTED_DEVICES), where it uses float32. So neuron gets
    a table that differs from CPU's by float32 rounding, and the difference is
    diffusers', not the device's: with the float64 table on both, the transformer's outputs are equal."""
    import diffusers.models.embeddings as embeddings_module

    pipe = tiny_pixart_sigma(sample_size=SIZE // 4)
    cpu_images, neuron_images, _ = draw_on_cpu_then_neuron(pipe, pipe.transformer, **pixart_inputs())
    np.testing.assert_allclose(neuron_images, cpu_images, rtol=0, atol=1e-5)

    transformer = pipe.transformer
    latents, text = embeddings((1, 4, SIZE // 2, SIZE // 2), (1, 7, 32))
    inputs = dict(hidden_states=latents, encoder_hidden_states=text, encoder_attention_mask=padding_mask(7, 5),
                  timestep=torch.tensor([500]), added_cond_kwargs={"resolution": None, "aspect_ratio": None})
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(embeddings_module, "maybe_adjust_dtype_for_device", lambda dtype, device: dtype)
        on_neuron = transformer(**{k: v.to("neuron") if isinstance(v, torch.Tensor) else v
                                   for k, v in inputs.items()}).sample
        on_cpu = transformer.to("cpu")(**inputs).sample
    assert on_neuron.device.type == "neuron"
    torch.testing.assert_close(on_neuron.cpu(), on_cpu, rtol=0, atol=0)


def test_qwenimage_transformer_pipeline_with_true_cfg_draws_on_neuron_what_cpu_draws():
    """QwenImage: a double-stream transformer with complex rotary embeddings, a tensor-parallel plan
    (_tp_plan) and a causal 3D VAE."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)

    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                              attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                              axes_dims_rope=(4, 6, 6))
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False],
                                 latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, transformer=transformer,
                             text_encoder=None, tokenizer=None)
    prompt, negative = embeddings((1, 7, 16), (1, 7, 16))
    cpu_images, neuron_images, seen = draw_on_cpu_then_neuron(
        pipe, transformer, prompt_embeds=prompt, prompt_embeds_mask=padding_mask(7, 5),
        negative_prompt_embeds=negative, negative_prompt_embeds_mask=padding_mask(7, 7), true_cfg_scale=4.0)
    assert seen == {"neuron"}
    np.testing.assert_array_equal(neuron_images, cpu_images)


def tiny_causal_lm(family):
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0)
    return getattr(transformers, f"{family}ForCausalLM")(config).eval()


PROMPTS = torch.randint(1, 300, (2, 5), generator=torch.Generator().manual_seed(1))
PROMPTS_MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # the second prompt is left-padded


@pytest.mark.parametrize("family", ["Qwen3", "Llama"])
def test_causal_lm_logits_and_greedy_generate_on_neuron_equal_cpu(family):
    cpu_model = tiny_causal_lm(family)
    model = copy.deepcopy(cpu_model).to("neuron")
    ids, mask = PROMPTS.to("neuron"), PROMPTS_MASK.to("neuron")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        cpu_logits = cpu_model(input_ids=PROMPTS, attention_mask=PROMPTS_MASK).logits
    assert logits.device.type == "neuron"
    torch.testing.assert_close(logits.cpu(), cpu_logits, rtol=0, atol=0)

    tokens = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    cpu_tokens = cpu_model.generate(PROMPTS, attention_mask=PROMPTS_MASK, max_new_tokens=8, do_sample=False)
    assert tokens.device.type == "neuron" and cpu_tokens.shape == (2, 13)
    assert tokens.cpu().tolist() == cpu_tokens.tolist()


def test_causal_lm_sampled_generate_on_neuron_draws_what_cpu_draws_for_the_same_seed():
    """torch.manual_seed seeds neuron's generator too, and it gives the CPU generator's numbers."""
    cpu_model = tiny_causal_lm("Qwen3")
    model = copy.deepcopy(cpu_model).to("neuron")
    sample = dict(max_new_tokens=8, do_sample=True, top_k=50, top_p=0.95, temperature=1.3)
    torch.manual_seed(3)
    tokens = model.generate(PROMPTS.to("neuron"), attention_mask=PROMPTS_MASK.to("neuron"), **sample)
    torch.manual_seed(3)
    cpu_tokens = cpu_model.generate(PROMPTS, attention_mask=PROMPTS_MASK, **sample)
    greedy = cpu_model.generate(PROMPTS, attention_mask=PROMPTS_MASK, max_new_tokens=8, do_sample=False)
    assert tokens.device.type == "neuron"
    assert cpu_tokens.tolist() != greedy.tolist()  # it did sample
    assert tokens.cpu().tolist() == cpu_tokens.tolist()


def test_accelerate_detects_neuron_and_trains_there_like_cpu():
    r = run("""
        import copy, json, torch
        from accelerate import Accelerator, PartialState
        from accelerate.utils import is_neuron_available

        state = PartialState()
        report = {"available": is_neuron_available(), "available_checked": is_neuron_available(check_device=True),
                  "state_device": str(state.device), "distributed_type": str(state.distributed_type)}
        accelerator = Accelerator()
        report["accelerator_device"] = str(accelerator.device)

        torch.manual_seed(0)
        cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        data = torch.utils.data.TensorDataset(torch.randn(12, 8), torch.randn(12, 1))
        model = copy.deepcopy(cpu_model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loader = torch.utils.data.DataLoader(data, batch_size=4)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        report["parameter_device"] = str(next(model.parameters()).device)
        losses = []
        for x, y in loader:
            report["batch_device"] = str(x.device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())

        cpu_optimizer = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
        cpu_losses = []
        for x, y in torch.utils.data.DataLoader(data, batch_size=4):
            loss = torch.nn.functional.mse_loss(cpu_model(x), y)
            loss.backward()
            cpu_optimizer.step()
            cpu_optimizer.zero_grad()
            cpu_losses.append(loss.item())
        report["same_losses"] = losses == cpu_losses
        report["same_weights"] = all(torch.equal(p.cpu(), q) for p, q in zip(model.parameters(), cpu_model.parameters()))
        print(json.dumps(report))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report == {"available": True, "available_checked": True, "state_device": "neuron",
                      "distributed_type": "DistributedType.NO", "accelerator_device": "neuron",
                      "parameter_device": "neuron:0", "batch_device": "neuron:0",
                      "same_losses": True, "same_weights": True}


ACCELERATE_RANK = """
import json, os, torch
from accelerate import Accelerator

accelerator = Accelerator()
index = accelerator.process_index
gathered = accelerator.gather(torch.tensor([float(index)], device=accelerator.device))
# gather() passes all_gather_into_tensor a flat output: TorchNeuron squeezes size-1 dimensions to match a row,
# and refuses a tensor of several rows (its _allgather_base checks the shape)
rows = accelerator.gather(torch.full((1, 3), float(index), device=accelerator.device))
try:
    accelerator.gather(torch.full((2, 3), float(index), device=accelerator.device))
    refused = ""
except NotImplementedError as error:
    refused = str(error).split(". Details: ")[1].split(". ")[0]
torch.manual_seed(0)
model, optimizer = accelerator.prepare(torch.nn.Linear(3, 1), torch.optim.Adam(torch.nn.Linear(3, 1).parameters()))
accelerator.backward(model(torch.full((2, 3), float(index + 1), device=accelerator.device)).sum())
state = os.path.join(os.environ["RESULT_DIR"], "state")
# pytorch format: safetensors refuses device="neuron:0" (its device list is fixed), on Trainium too
accelerator.save_state(state, safe_serialization=False)
accelerator.wait_for_everyone()  # a barrier with device_ids=[local rank]
accelerator.load_state(state, map_location="on_device")
report = {"distributed_type": str(accelerator.distributed_type), "device": str(accelerator.device),
          "core": torch.neuron.get_device_properties(accelerator.device).core_id,
          "backend": torch.distributed.get_backend(), "gathered": gathered.tolist(),
          "gathered_device": gathered.device.type, "rows": rows.tolist(), "refused": refused,
          "model": type(model).__name__,
          "grad": model.module.weight.grad.tolist(), "grad_device": str(model.module.weight.grad.device)}
with open(os.path.join(os.environ["RESULT_DIR"], f"rank{index}.txt"), "w") as f:
    f.write(json.dumps(report))
"""


def test_accelerate_under_torchrun_gives_each_process_its_neuron_core_and_gathers_over_neuron(tmp_path):
    script = tmp_path / "accelerate_rank.py"
    script.write_text(ACCELERATE_RANK)
    r = torchrun(str(script), 2, RESULT_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank{rank}.txt").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        # one core per process, as on TorchNeuron: each sees its core as neuron:<LOCAL_RANK>, and DDP is given it
        assert report == {"distributed_type": "DistributedType.MULTI_NEURON", "device": f"neuron:{rank}", "core": rank,
                          "backend": "neuron", "gathered": [0.0, 1.0], "gathered_device": "neuron",
                          "rows": [[0.0] * 3, [1.0] * 3], "model": "DistributedDataParallel",
                          "refused": "output shape mismatch, expected (4, 3), got torch.Size([12])",
                          "grad": [[3.0] * 3], "grad_device": f"neuron:{rank}"}  # d/dw of the summed outputs, averaged
