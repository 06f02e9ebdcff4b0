"""Run under torchrun (2 or 4 processes): nn.SyncBatchNorm trains on neuron as one CPU process with
nn.BatchNorm over the whole batch (the oracle): the same losses, gradients and weights, step by step,
each rank holding its slice of every batch. As on TorchNeuron, the running statistics stay as they
were (its batch_norm_gather_stats_with_counts does not update them). Each rank writes "<rank> <steps>"
to RESULT_DIR. Used by tests/test_sync_batch_norm.py."""
import copy
import os

import torch
import torch.distributed as dist
from torch import nn

STEPS, BATCH_PER_RANK = 3, 3

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))

torch.manual_seed(0)
oracle = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 1))
model = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(oracle)).to(dev)
assert isinstance(model[1], nn.SyncBatchNorm)
oracle_opt = torch.optim.SGD(oracle.parameters(), lr=0.1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(STEPS):
    inputs, targets = torch.randn(world * BATCH_PER_RANK, 3, 6, 6), torch.randn(world * BATCH_PER_RANK, 1)
    expected = nn.functional.mse_loss(oracle(inputs), targets)
    expected.backward()
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    # Each rank's loss is the mean over its slice: their mean is the whole batch's loss, and the sum of
    # their gradients (scaled by the ranks) the whole batch's gradient.
    loss = nn.functional.mse_loss(model(inputs[mine].to(dev)), targets[mine].to(dev))
    (loss / world).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    total = loss.detach().clone()
    dist.all_reduce(total)
    torch.testing.assert_close(total.cpu() / world, expected.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), oracle.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6, msg=f"step {step}: {name}.grad")
    opt.step(), oracle_opt.step()
    opt.zero_grad(), oracle_opt.zero_grad()
    for p, q in zip(model.parameters(), oracle.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-6)

sync_bn = model[1]
assert sync_bn.num_batches_tracked.item() == STEPS
assert torch.equal(sync_bn.running_mean.cpu(), torch.zeros(4)) and torch.equal(sync_bn.running_var.cpu(), torch.ones(4))
assert not torch.equal(oracle[1].running_mean, torch.zeros(4))  # CUDA's kernel, and CPU's BatchNorm, update them

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:
    f.write(f"{rank} {STEPS}")
dist.destroy_process_group()
