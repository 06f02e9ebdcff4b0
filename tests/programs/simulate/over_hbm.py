"""Rank 1 allocates 30 GiB on its core (fake in the simulator: no memory is used)."""
import torch
import torch.distributed as dist

dist.init_process_group("neuron")
small = torch.zeros(1024, device="neuron")
if dist.get_rank() == 1:
    big = torch.empty(30 << 30, dtype=torch.uint8, device="neuron")  # the allocation that does not fit
dist.destroy_process_group()
