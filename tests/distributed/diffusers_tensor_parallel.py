"""Run under torchrun (2 or 4 processes): diffusers' tensor parallelism on neuron, set up as the
seed writes it, by both of its paths: `enable_parallelism` on a model in memory with CPU weights
(diffusers' `_apply_tp_neuron`) and `from_pretrained(path, parallel_config=...)`, which streams
each rank's shard from safetensors. Both equal the unsharded model run in one CPU process.
With COMPILE=1 the sharded model is then compiled with `compile_repeated_blocks(backend="neuron")`.
MODEL_DIR is where rank 0 saves the checkpoint; each rank writes "<rank> <checks>" to RESULT_DIR."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from diffusers import Flux2Transformer2DModel, TensorParallelConfig

dist.init_process_group(backend="neuron")
mesh = DeviceMesh("neuron", list(range(dist.get_world_size())))
device = torch.neuron.current_device()
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", device)


def tiny_flux2():
    torch.manual_seed(0)
    return Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False).eval()


generator = torch.Generator().manual_seed(1)
tokens, text = 16, 8
inputs = {
    "hidden_states": torch.randn(1, tokens, 16, generator=generator),
    "encoder_hidden_states": torch.randn(1, text, 32, generator=generator),
    "timestep": torch.tensor([0.5]),
    "img_ids": torch.randint(0, 4, (tokens, 4), generator=generator),
    "txt_ids": torch.zeros(text, 4, dtype=torch.long),
}
on_neuron = {name: t.to(dev) for name, t in inputs.items()}
checks = []


def check(name, model):
    with torch.no_grad():
        out = model(**on_neuron).sample
    assert out.device == dev and not isinstance(out, DTensor), (name, out.device, type(out))
    difference = (out.cpu() - reference).abs().max().item()
    assert difference < 1e-5, f"{name} on rank {rank}: max difference {difference} from the unsharded model"
    checks.append(name)


def sharded(model):
    weight = model.transformer_blocks[0].attn.to_q.weight
    assert isinstance(weight, DTensor) and weight.device == dev, (type(weight), weight.device)
    assert weight.to_local().shape[0] == weight.shape[0] // world, weight.to_local().shape
    return model


model = tiny_flux2()
with torch.no_grad():
    reference = model(**inputs).sample

# Path 1: a model already in memory, CPU weights, then moved to the rank's core.
model.enable_parallelism(config=TensorParallelConfig(mesh=mesh))
check("enable_parallelism", sharded(model.to(dev)))

# Path 2: the seed's from_pretrained(..., parallel_config=...), each rank reading its shard.
path = os.environ["MODEL_DIR"]
if rank == 0:
    tiny_flux2().save_pretrained(path)
dist.barrier()
loaded = Flux2Transformer2DModel.from_pretrained(path, parallel_config=TensorParallelConfig(mesh=mesh))
check("from_pretrained parallel_config", sharded(loaded).to(dev))

# Compiled, block by block, as the seed's compiled program does: the graphs get DTensor
# parameters, and the collectives tensor parallelism needs end up inside them.
if os.environ.get("COMPILE") == "1":
    loaded.compile_repeated_blocks(backend="neuron", fullgraph=True, dynamic=False)
    check("compile_repeated_blocks (first call compiles)", loaded)
    check("compile_repeated_blocks (second call reuses)", loaded)
    metrics = torch.neuron.get_dynamo_metrics()
    assert len(metrics) == 2 and all(m["has_collectives"] and not m["fell_back"] for m in metrics), metrics

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:
    f.write(f"{rank} {len(checks)}")
dist.destroy_process_group()
