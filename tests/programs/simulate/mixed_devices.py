"""Names another rank's core: the model on the rank's own core, the input explicitly on neuron:1, the
core of local rank 1. Must fail on rank 0, naming the line, as TorchNeuron refuses it there."""
import torch
import torch.distributed as dist

dist.init_process_group("neuron")
model = torch.nn.Linear(16, 16).to("neuron")
x = torch.randn(4, 16, device="neuron:1")  # another rank's core
y = model(x)
dist.destroy_process_group()
