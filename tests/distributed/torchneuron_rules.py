"""Run under torchrun (2 or 4 processes): the `neuron` group keeps the rules of TorchNeuron's
ProcessGroupNeuron (its torch_neuronx/distributed/backend.py and the checks of its XLA collectives):
what a call means where Gloo would mean something else, and what it refuses, in TorchNeuron's words
with the fix after them. Results are checked against values computed on CPU. Each rank writes
"<rank> <checks>" to RESULT_DIR. Used by tests/test_distributed.py."""
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
checks = []


def same(name, got, expected):
    assert got.device == dev and torch.equal(got.cpu(), expected), f"{name} on rank {rank}: {got.cpu()} != {expected}"
    checks.append(name)


def refused(name, call, error, words):
    try:
        call()
    except error as e:
        assert words in str(e), f"{name}: {e}"
        checks.append(name)
        return
    raise AssertionError(f"{name}: not refused")


def per_rank(make):
    """make(r) for every rank, on CPU: what each rank contributes."""
    return [make(r) for r in range(world)]


# -- what a call means

def summed(make):
    return sum(per_rank(make))


t = torch.full((3,), float(rank + 1), device=dev)
dist.reduce(t, dst=0)
same("reduce: the root takes the sum, the others keep theirs", t,
     summed(lambda r: torch.full((3,), float(r + 1))) if rank == 0 else torch.full((3,), float(rank + 1)))

out = torch.zeros(2, device=dev)
dist.reduce_scatter(out, [torch.arange(2.0 * world, device=dev) * (rank + 1)])
same("reduce_scatter of a one-tensor list splits it by the group", out,
     summed(lambda r: torch.arange(2.0 * world) * (r + 1)).chunk(world)[rank])

out = torch.zeros(3, 2, device=dev)
dist.reduce_scatter_tensor(out, torch.arange(6.0 * world, device=dev).view(3, 2 * world) + rank)
same("reduce_scatter_tensor along the dimension that differs", out,
     summed(lambda r: torch.arange(6.0 * world).view(3, 2 * world) + r).chunk(world, dim=1)[rank])

out = torch.zeros(1, 4 * world, device=dev)
dist.all_gather_into_tensor(out, torch.arange(4.0, device=dev) + 10 * rank)
same("all_gather_into_tensor squeezes the ranks that differ", out,
     torch.cat(per_rank(lambda r: torch.arange(4.0) + 10 * r)).view(1, -1))

outputs = [[torch.zeros(2, 2, device=dev) for _ in range(world)], [torch.zeros(3, device=dev) for _ in range(world)]]
dist.all_gather_coalesced(outputs, [torch.full((2, 2), float(rank), device=dev), torch.full((3,), rank + 10.0, device=dev)])
for r in range(world):  # [tensor][rank]
    same(f"all_gather_coalesced outputs[0][{r}]", outputs[0][r], torch.full((2, 2), float(r)))
    same(f"all_gather_coalesced outputs[1][{r}]", outputs[1][r], torch.full((3,), r + 10.0))

t = torch.tensor([rank + 1, -(rank + 1)], dtype=torch.int32, device=dev)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
total = world * (world + 1) // 2
same("integer AVG truncates", t, torch.tensor([int(total / world), int(-total / world)], dtype=torch.int32))

for factor in (2.5, torch.tensor([2.5], device=dev)):
    t = torch.arange(4.0, device=dev) + rank
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
    same(f"PREMUL_SUM by a {type(factor).__name__}", t, summed(lambda r: (torch.arange(4.0) + r) * 2.5))

empty, t = torch.zeros(0, device=dev), torch.ones(2, device=dev)
dist.all_reduce_coalesced([empty, t])
same("all_reduce_coalesced skips an empty tensor", t, torch.full((2,), float(world)))

out = torch.ones(2, device=dev)
dist.scatter(out, None, src=world + 1)
same("scatter from a src outside the group: every rank sends zeros", out, torch.zeros(2))

# -- what it refuses

refused("a CPU tensor", lambda: dist.all_reduce(torch.ones(2)), ValueError, "Expected neuron device, got cpu")
refused("an empty tensor", lambda: dist.all_reduce(torch.ones(0, device=dev)), NotImplementedError,
        "tensors cannot be empty, found empty tensors at indices: [0]")
refused("an empty all_gather", lambda: dist.all_gather([torch.ones(0, device=dev)] * world, torch.ones(0, device=dev)),
        ValueError, "tensors cannot have zero size in dimension 0")
for op in (dist.ReduceOp.PRODUCT, dist.ReduceOp.BAND):
    refused(f"reduce op {op}", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32, device=dev), op=op),
            NotImplementedError, f"unsupported reduce operation '{str(op).rsplit('.', 1)[-1]}', supported ops: "
            "['SUM', 'AVG', 'MIN', 'MAX']")
refused("a root outside the group", lambda: dist.broadcast(torch.ones(2, device=dev), src=world + 3), ValueError,
        f"Invalid rootRank {world + 3} for broadcast with world size {world}")
refused("a gather output of another shape",
        lambda: dist.all_gather_into_tensor(torch.zeros(4 * world, device=dev), torch.zeros(2, 2, device=dev)),
        NotImplementedError, f"output shape mismatch, expected ({2 * world}, 2), got torch.Size([{4 * world}])")
refused("an input the group does not divide",
        lambda: dist.reduce_scatter_tensor(torch.zeros(2, device=dev), torch.zeros(2 * world + 1, device=dev)),
        NotImplementedError, "must be evenly divisible by replica group size")
refused("uneven all_to_all splits",
        lambda: dist.all_to_all_single(torch.zeros(world + 1, device=dev), torch.zeros(world + 1, device=dev),
                                       [2] + [1] * (world - 1), [2] + [1] * (world - 1)),
        NotImplementedError, "alltoall_base: Only even split sizes are supported")
if world not in (4, 8, 16):
    refused("all_to_all on a group Trainium has no AllToAll for",
            lambda: dist.all_to_all_single(torch.zeros(world, device=dev), torch.zeros(world, device=dev)),
            NotImplementedError, f"unsupported world size {world}, supported sizes: 4, 8, 16, or multiples of 32")
else:  # torch's functional all_to_all_single passes split sizes: TorchNeuron takes all ones only
    t = torch.arange(world, device=dev) + 10 * rank
    same("funcol all_to_all_single of one row per rank", funcol.all_to_all_single(t, None, None, dist.group.WORLD).wait(),
         torch.tensor(per_rank(lambda r: 10 * r + rank)))
    refused("funcol all_to_all_single of two rows per rank",
            lambda: funcol.all_to_all_single(torch.zeros(2 * world, device=dev), None, None, dist.group.WORLD),
            NotImplementedError, f"Only even split sizes are supported. Got output_split_sizes: {[2] * world}")
if world > 2:
    pair = dist.new_group([0, 1])
    if rank < 2:
        refused("a barrier on a subgroup", lambda: dist.barrier(group=pair), NotImplementedError,
                "Barrier is implemented only for default group")
dist.barrier()

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:
    f.write(f"{rank} {len(checks)}")
dist.destroy_process_group()
