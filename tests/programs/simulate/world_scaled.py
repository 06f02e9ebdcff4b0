"""A value that depends on the world size: equal across ranks, different from one device's."""
import torch
import torch.distributed as dist

dist.init_process_group("neuron")
scaled = torch.ones(4).to("neuron") * dist.get_world_size()
dist.destroy_process_group()
