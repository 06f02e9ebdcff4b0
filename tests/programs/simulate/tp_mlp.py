"""A tensor-parallel MLP (ColwiseParallel then RowwiseParallel) over every rank, written for
torchrun: one forward and backward, whose RowwiseParallel output is one all_reduce per step."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

HIDDEN = int(os.environ.get("MLP_HIDDEN", "1024"))

dist.init_process_group("neuron")
device = torch.device("neuron", torch.neuron.current_device())  # the local rank's core
mesh = init_device_mesh("neuron", (dist.get_world_size(),), mesh_dim_names=("tp",))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.GELU(),
                            torch.nn.Linear(4 * HIDDEN, HIDDEN)).to(device)
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
x = torch.randn(8, HIDDEN).to(device)  # drawn on the CPU: the same values on every rank and in every mode
out = model(x)
out.sum().backward()
dist.destroy_process_group()
