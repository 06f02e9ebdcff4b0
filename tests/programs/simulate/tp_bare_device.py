"""A user's tensor-parallel MLP as written for torchrun, with a bare "neuron" everywhere: the model
moved with .to("neuron") (C++ fills in the current device), the input made with device="neuron"
(a factory). Once failed on the last rank of the simulator (neuron:63 vs neuron:0). The sizes
default to the report's (4096 x 16384); TP_HIDDEN and TP_FFN make it small."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

HIDDEN = int(os.environ.get("TP_HIDDEN", "4096"))
FFN = int(os.environ.get("TP_FFN", "16384"))

dist.init_process_group("neuron")
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
m = torch.nn.Sequential(torch.nn.Linear(HIDDEN, FFN, bias=False), torch.nn.GELU(),
                        torch.nn.Linear(FFN, HIDDEN, bias=False)).to("neuron")
parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
m(torch.randn(8, HIDDEN, device="neuron")).sum().backward()
