"""Run under torchrun (2 or 4 processes): DeviceMesh, DTensor, tensor parallelism, DDP and FSDP2
on neuron give what one CPU process computes on the whole problem (the oracle). Each rank writes
"<rank> <checks>" to RESULT_DIR. Used by tests/test_distributed.py."""
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group(backend="neuron")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = DeviceMesh("neuron", list(range(world)))
device = torch.neuron.current_device()
dev = torch.device("neuron", device)
checks = []


def check(name, neuron_result, expected, exact=False):
    assert neuron_result.device.type == "neuron", f"{name}: on {neuron_result.device}"
    got = neuron_result.cpu()
    ok = torch.equal(got, expected) if exact else torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert ok, f"{name} on rank {rank}: max difference {(got - expected).abs().max()}"
    checks.append(name)


# The mesh: the seed's DeviceMesh(...) and init_device_mesh agree, on this process's core, neuron:<LOCAL_RANK>.
assert device == int(os.environ["LOCAL_RANK"]) and mesh.device_type == "neuron" and mesh.size() == world
assert init_device_mesh("neuron", (world,)).mesh.tolist() == mesh.mesh.tolist()

# DTensor: placements and redistribution move exactly the right values.
torch.manual_seed(0)
a, b = torch.randn(8, 12), torch.randn(12, 4)
rows = distribute_tensor(a.to(dev), mesh, [Shard(0)])
check("distribute_tensor Shard(0)", rows.to_local(), a.chunk(world)[rank], exact=True)
if world in (4, 8, 16):  # an all_to_all: Trainium runs it on 4, 8, 16 (or a multiple of 32) ranks
    check("redistribute Shard(0)->Shard(1)", rows.redistribute(mesh, [Shard(1)]).to_local(),
          a.chunk(world, 1)[rank], exact=True)
else:
    try:
        rows.redistribute(mesh, [Shard(1)])
    except NotImplementedError as error:
        assert f"unsupported world size {world}, supported sizes: 4, 8, 16" in str(error), error
        checks.append("redistribute Shard(0)->Shard(1) refused, as on Trainium")
check("redistribute Shard->Replicate", rows.redistribute(mesh, [Replicate()]).to_local(), a, exact=True)
uneven = distribute_tensor(torch.arange(5.0, device=dev), mesh, [Shard(0)])
check("uneven shard full_tensor", uneven.full_tensor(), torch.arange(5.0), exact=True)
partial = DTensor.from_local(torch.full((3,), float(rank + 1), device=dev), mesh, [Partial()])
check("Partial -> Replicate (all_reduce)", partial.full_tensor(), torch.full((3,), world * (world + 1) / 2),
      exact=True)
gathered = DTensor.from_local(torch.full((2,), float(rank), device=dev), mesh, [Shard(0)]).full_tensor()
check("from_local Shard(0).full_tensor", gathered, torch.arange(world).float().repeat_interleave(2), exact=True)
inner = distribute_tensor(a.to(dev), mesh, [Shard(1)]) @ distribute_tensor(b.to(dev), mesh, [Shard(0)])
assert inner.placements == (Partial(),), inner.placements
check("sharded matmul (inner dim)", inner.full_tensor(), a @ b)
check("sharded matmul (rows)", (rows @ distribute_tensor(b.to(dev), mesh, [Replicate()])).full_tensor(), a @ b)
check("DTensor mean", rows.mean().full_tensor(), a.mean())

# Tensor parallelism: Colwise then Rowwise, forward, backward and an optimizer step.
torch.manual_seed(1)
reference = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
x = torch.randn(5, 16)
tp = parallelize_module(copy.deepcopy(reference).to(dev), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
assert tp[0].weight.placements == (Shard(0),) and tp[2].weight.placements == (Shard(1),)
out = tp(x.to(dev))
expected = reference(x)
check("TP forward", out, expected.detach())
out.square().sum().backward()
expected.square().sum().backward()
for name, p in tp.named_parameters():
    check(f"TP grad {name}", p.grad.full_tensor(), reference.get_parameter(name).grad)
torch.optim.SGD(tp.parameters(), lr=0.1).step()
torch.optim.SGD(reference.parameters(), lr=0.1).step()
check("TP step", tp[2].weight.full_tensor(), reference[2].weight.detach())

# Data parallelism: each rank takes its slice of the batch; two steps equal two full-batch steps.
torch.manual_seed(2)
reference = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))
batch, target = torch.randn(4 * world, 6), torch.randn(4 * world, 3)
mine = slice(4 * rank, 4 * rank + 4)


def train(model, inputs, targets, steps=2):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return model


ddp = train(DistributedDataParallel(copy.deepcopy(reference).to(dev), device_ids=[device]), batch[mine].to(dev),
            target[mine].to(dev))
fsdp_model = copy.deepcopy(reference).to(dev)
for layer in (fsdp_model[0], fsdp_model[2]):
    fully_shard(layer, mesh=mesh)
fsdp = train(fully_shard(fsdp_model, mesh=mesh), batch[mine].to(dev), target[mine].to(dev))
train(reference, batch, target)
for name, p in reference.named_parameters():
    check(f"DDP {name}", ddp.module.get_parameter(name).detach(), p.detach())
    sharded = fsdp.get_parameter(name)
    assert isinstance(sharded, DTensor) and sharded.placements == (Shard(0),), name
    check(f"FSDP2 {name}", sharded.full_tensor().detach(), p.detach())

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:
    f.write(f"{rank} {len(checks)}")
dist.destroy_process_group()
