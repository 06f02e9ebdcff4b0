"""A tensor-parallel MLP whose model and input are placed by one of the habits of torchrun
programs (--habit NAME); every one must put them on the rank's own core, neuron:<LOCAL_RANK>, on
every rank: the device a bare "neuron" names, through a factory and through .to(). All but one:
"index0" hard-codes neuron:0, which is another rank's core on every local rank above 0 and fails
there, on Trainium as in the simulator."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

parser = argparse.ArgumentParser()
parser.add_argument("--habit", required=True)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--ffn", type=int, default=256)
args = parser.parse_args()
H, F = args.hidden, args.ffn


def mlp(**factory):
    return torch.nn.Sequential(torch.nn.Linear(H, F, bias=False, **factory), torch.nn.GELU(),
                               torch.nn.Linear(F, H, bias=False, **factory))


dist.init_process_group("neuron")
habit = args.habit
if habit == "bare":  # the model moved (C++ picks the index), the input made there (a factory)
    model, x = mlp().to("neuron"), torch.randn(8, H, device="neuron")
elif habit == "to":  # the other way round: the model made on the device, the input moved
    model, x = mlp(device="neuron"), torch.randn(8, H).to("neuron")
elif habit == "index0":
    model, x = mlp().to("neuron:0"), torch.randn(8, H, device="neuron:0")
elif habit == "current_device":  # an int: torch takes it as the accelerator's index
    device = torch.neuron.current_device()
    model, x = mlp().to(device), torch.randn(8, H, device=device)
elif habit == "device_of_current":
    device = torch.device("neuron", torch.neuron.current_device())
    model, x = mlp().to(device), torch.randn(8, H).to(device)
elif habit == "method":  # like .cuda(): Tensor.neuron() and Module.neuron()
    model, x = mlp().neuron(), torch.randn(8, H).neuron()
elif habit == "set_device":  # the CUDA habit: pin the local rank's device, then say "neuron"
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    model, x = mlp().to("neuron"), torch.randn(8, H, device="neuron")
elif habit == "local_rank_index":  # "neuron:<local rank>", as where a process sees every core
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    model, x = mlp().to(device), torch.randn(8, H, device="neuron")
elif habit == "device_context":
    with torch.neuron.device(int(os.environ["LOCAL_RANK"])):
        model, x = mlp().to("neuron"), torch.randn(8, H, device="neuron")
else:
    raise SystemExit(f"unknown habit {habit!r}")
# What a bare "neuron" means through a factory and through .to(): the rank's own core, neuron:<LOCAL_RANK>.
own = {torch.empty(0, device="neuron").device, torch.empty(0).to("neuron").device}
placed = {x.device, *(p.device for p in model.parameters())}
expected = {torch.device("neuron", int(os.environ["LOCAL_RANK"]))}
assert placed == own == expected, f"{habit}: placed on {placed}, 'neuron' is {own}"
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
out = model(x)
out.sum().backward()
assert out.device == x.device == model[0].weight.device, (out.device, x.device)
dist.destroy_process_group()
