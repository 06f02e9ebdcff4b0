"""Each rank all_reduces a buffer as long as its rank: a bug that no comparison in the program shows
(the rank goes to torch unread), so only the runs' records tell the ranks apart."""
import torch
import torch.distributed as dist

dist.init_process_group("neuron")
device = torch.device("neuron", torch.neuron.current_device())
buffer = torch.ones(dist.get_rank(), device=device)
dist.all_reduce(buffer)  # sizes differ across ranks
dist.destroy_process_group()
