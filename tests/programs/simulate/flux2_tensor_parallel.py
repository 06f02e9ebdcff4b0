"""The seed's Flux2 transformer (diffusers' Flux2Transformer2DModel) tensor parallel over every rank
with diffusers' own TensorParallelConfig, one denoising forward in bf16. Built on the meta device,
sharded, then given (random) weights, each rank drawing its own shard. Default: the FLUX.2-klein-4B configuration (5 double blocks,
20 single blocks, 24 heads of 128, text features 3 x 2560); `--small` shrinks it for the tests."""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from diffusers import Flux2Transformer2DModel, TensorParallelConfig

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true")
parser.add_argument("--image-tokens", type=int, default=4096)  # a 1024x1024 image: (1024/16)^2 latents
parser.add_argument("--text-tokens", type=int, default=512)
args = parser.parse_args()
if args.small:
    config = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                  num_attention_heads=4, joint_attention_dim=32, timestep_guidance_channels=32,
                  axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)
else:
    config = dict(patch_size=1, in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=7680, timestep_guidance_channels=256,
                  axes_dims_rope=(32, 32, 32, 32), guidance_embeds=False)

dist.init_process_group("neuron")
device = torch.device("neuron", torch.neuron.current_device())
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
with torch.device("meta"):
    model = Flux2Transformer2DModel(**config).to(torch.bfloat16).eval()
model.enable_parallelism(config=TensorParallelConfig(mesh=mesh))
model.to_empty(device=device)
with torch.no_grad():
    # Each rank fills its own shard: DTensor's random ops (p.normal_ on the DTensor) keep a Philox
    # seed+offset per shard, which neuron's CPU-style (mt19937) generator does not have.
    for p in model.parameters():
        getattr(p, "to_local", lambda: p)().normal_(0, 0.02)
    hidden = torch.randn(1, args.image_tokens, config["in_channels"], dtype=torch.bfloat16).to(device)
    text = torch.randn(1, args.text_tokens, config["joint_attention_dim"], dtype=torch.bfloat16).to(device)
    out = model(hidden_states=hidden, encoder_hidden_states=text, timestep=torch.tensor([0.5]).to(device),
                img_ids=torch.zeros(args.image_tokens, 4, dtype=torch.long).to(device),
                txt_ids=torch.zeros(args.text_tokens, 4, dtype=torch.long).to(device)).sample
dist.destroy_process_group()
