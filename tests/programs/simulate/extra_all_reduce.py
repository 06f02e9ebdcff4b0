"""Every rank all_reduces a gradient-sized tensor; rank 3 alone calls one more all_reduce, a bug
that hangs a real job (the others never join it)."""
import torch
import torch.distributed as dist

dist.init_process_group("neuron")
rank = dist.get_rank()
device = torch.device("neuron", torch.neuron.current_device())
grad = torch.ones(1024, device=device)
dist.all_reduce(grad)
if rank == 3:
    dist.all_reduce(torch.ones(4, device=device))  # only rank 3 gets here
dist.barrier()
dist.destroy_process_group()
