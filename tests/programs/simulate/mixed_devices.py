"""Really mixes devices: the model on the rank's own core, the input explicitly on neuron:1 (another
core of the node, on every rank but the one whose local rank is 1). Must fail, naming the line."""
import torch
import torch.distributed as dist

dist.init_process_group("neuron")
model = torch.nn.Linear(16, 16).to("neuron")
x = torch.randn(4, 16, device="neuron:1")
y = model(x)  # the line that mixes them
dist.destroy_process_group()
