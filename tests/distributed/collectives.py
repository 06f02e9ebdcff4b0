"""Run under torchrun (any number of processes; PG_BACKEND "neuron", or empty for no backend
argument). Every rank binds to its own core, and every collective of the `neuron` group gives on
neuron tensors exactly what Gloo gives on CPU tensors of the same group (the oracle), in place
where torch's contract is in place. Each rank writes "<rank> <backend> <checks> node=<torchrun's
node rank> core=<its core>" to RESULT_DIR. Used by tests/test_distributed.py."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

backend = os.environ.get("PG_BACKEND", "neuron")
dist.init_process_group(backend or None, timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ["LOCAL_RANK"])
# TorchNeuron's numbering: this process's one core is neuron:<LOCAL_RANK> of LOCAL_WORLD_SIZE devices.
assert torch.neuron.device_count() == int(os.environ["LOCAL_WORLD_SIZE"]), torch.neuron.device_count()
assert torch.neuron.current_device() == local == torch.accelerator.current_device_index()
assert torch.neuron.get_device_properties(local).core_id == local
dev = torch.device("neuron", local)
checks = []


def same(name, neuron_result, cpu_result):
    """Results of the neuron run equal those of the CPU run, and stayed on neuron."""
    if isinstance(neuron_result, torch.Tensor):
        neuron_result, cpu_result = [neuron_result], [cpu_result]
    for n, c in zip(neuron_result, cpu_result, strict=True):
        assert n.device == dev, f"{name}: result on {n.device}"
        assert torch.equal(n.cpu(), c), f"{name} on rank {rank}:\nneuron {n.cpu()}\ncpu    {c}"
    checks.append(name)


def on_both(name, run, *make_inputs):
    """run(*inputs) with inputs built on neuron and on CPU; run returns the tensors to compare."""
    results = []
    for device in (dev, "cpu"):
        inputs = []
        for make in make_inputs:
            made = make()
            inputs.append([t.to(device) for t in made] if isinstance(made, list) else made.to(device))
        results.append(run(*inputs))
    same(name, *results)


def mine(n=4, dtype=torch.float32):
    return lambda: (torch.arange(n, dtype=torch.float32) + 1 + rank * n).to(dtype)


def zeros(n, dtype=torch.float32):
    return lambda: torch.zeros(n, dtype=dtype)


def listed(k, n):
    return lambda: [torch.zeros(n) for _ in range(k)]


def in_place(op):
    def run(t):
        ptr = t.data_ptr()
        op(t)
        assert t.data_ptr() == ptr, "a collective replaced its in-place tensor"
        return t
    return run


# all_reduce: every reduce op Gloo has, plus AVG (SUM, then a division on the device).
for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
    on_both(f"all_reduce {op}", in_place(lambda t, op=op: dist.all_reduce(t, op=op)), mine())
for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
    on_both(f"all_reduce {op}", in_place(lambda t, op=op: dist.all_reduce(t, op=op)), mine(dtype=torch.int32))
for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.uint8):
    on_both(f"all_reduce {dtype}", in_place(dist.all_reduce), mine(dtype=dtype))
avg = mine()().to(dev)
dist.all_reduce(avg, op=dist.ReduceOp.AVG)
expected = sum(mine()().add(4 * (r - rank)) for r in range(world)) / world
same("all_reduce AVG", avg, expected)
on_both("all_reduce async", in_place(lambda t: dist.all_reduce(t, async_op=True).wait()), mine())

# gathers, scatters, reductions to one rank
on_both("all_gather", lambda out, t: (dist.all_gather(out, t), out)[1], listed(world, 4), mine())
on_both("all_gather_into_tensor", lambda out, t: (dist.all_gather_into_tensor(out, t), out)[1],
        zeros(4 * world), mine())
# A flat output (numel = world x the input's), as NCCL takes it and accelerate's gather() passes it; Gloo
# on CPU tensors (the oracle) is given the same bytes as (world x 2, 2).
flat = torch.zeros(4 * world, device=dev)
dist.all_gather_into_tensor(flat, mine()().view(2, 2).to(dev))
shaped = torch.zeros(2 * world, 2)
dist.all_gather_into_tensor(shaped, mine()().view(2, 2))
if os.environ.get("TORCH_NEURONX_COLLECTIVE_CHECKS", "1") != "0":  # CPU tensors too, through the checked group
    flat_cpu = torch.zeros(4 * world)
    dist.all_gather_into_tensor(flat_cpu, mine()().view(2, 2))
    assert torch.equal(flat_cpu, shaped.flatten()), flat_cpu
same("all_gather_into_tensor flat output", flat, shaped.flatten())
on_both("reduce_scatter", lambda out, ts: (dist.reduce_scatter(out, ts), out)[1], zeros(3),
        lambda: [torch.arange(3.0) * (r + 1) + rank for r in range(world)])
on_both("reduce_scatter_tensor", lambda out, t: (dist.reduce_scatter_tensor(out, t), out)[1], zeros(2),
        mine(2 * world))
on_both("broadcast", in_place(lambda t: dist.broadcast(t, src=world - 1)), mine())
on_both("reduce", in_place(lambda t: dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)), mine())
on_both("gather", lambda t, out: (dist.gather(t, out if rank == 0 else None, dst=0), out)[1],
        mine(), listed(world, 4))
on_both("scatter", lambda out, ts: (dist.scatter(out, ts if rank == 0 else None, src=0), out)[1],
        zeros(4), lambda: [torch.full((4,), 10.0 * r) for r in range(world)])
on_both("all_to_all", lambda outs, ins: (dist.all_to_all(outs, ins), outs)[1], listed(world, 2),
        lambda: [torch.full((2,), 10.0 * rank + r) for r in range(world)])
on_both("all_to_all_single", lambda out, t: (dist.all_to_all_single(out, t), out)[1], zeros(2 * world),
        mine(2 * world))
splits_in = [r + 1 for r in range(world)]  # this rank sends r+1 elements to rank r,
splits_out = [rank + 1] * world  # so it receives rank+1 from every peer
on_both("all_to_all_single uneven", lambda out, t: (dist.all_to_all_single(out, t, splits_out, splits_in), out)[1],
        zeros(sum(splits_out)), mine(sum(splits_in)))

# coalesced forms
on_both("all_reduce_coalesced", lambda a, b: (dist.all_reduce_coalesced([a, b]), [a, b])[1], mine(), mine(3))


def coalesced_gather(out, t):
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(out, t)
    cm.wait()
    return out


def coalesced_reduce_scatter(out, t):
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(out, t)
    cm.wait()
    return out


on_both("all_gather_into_tensor coalesced", coalesced_gather, zeros(4 * world), mine())
on_both("reduce_scatter_tensor coalesced", coalesced_reduce_scatter, zeros(2), mine(2 * world))

# point to point, between every pair of neighbours
nxt, prv = (rank + 1) % world, (rank - 1) % world


def ring(t, out):
    if world == 1:
        return out.copy_(t)
    if rank % 2 == 0:
        dist.send(t, nxt); dist.recv(out, prv)
    else:
        dist.recv(out, prv); dist.send(t, nxt)
    return out


def ring_async(t, out):
    ops = [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, out, prv)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out


on_both("send/recv", ring, mine(), zeros(4))
on_both("isend/irecv", ring_async, mine(), zeros(4))

# functional collectives (what DTensor and compiled graphs use)
on_both("funcol all_reduce", lambda t: funcol.all_reduce(t, "sum", dist.group.WORLD).wait(), mine())
on_both("funcol all_reduce avg", lambda t: funcol.all_reduce(t, "avg", dist.group.WORLD).wait(), mine())
on_both("funcol all_gather_tensor", lambda t: funcol.all_gather_tensor(t, 0, dist.group.WORLD).wait(), mine())
on_both("funcol reduce_scatter_tensor",
        lambda t: funcol.reduce_scatter_tensor(t, "sum", 0, dist.group.WORLD).wait(), mine(2 * world))
on_both("funcol all_to_all_single",
        lambda t: funcol.all_to_all_single(t, None, None, dist.group.WORLD).wait(), mine(2 * world))

# objects, barriers, a subgroup
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank})
assert objects == [{"rank": r} for r in range(world)], objects
dist.barrier()
if world > 1:
    pair = dist.new_group([0, 1])
    if rank < 2:
        on_both("subgroup all_reduce", in_place(lambda t: dist.all_reduce(t, group=pair)), mine())

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:  # not stdout: ranks interleave
    f.write(f"{rank} {dist.get_backend()} {len(checks)} node={os.environ['GROUP_RANK']} "
            f"core={torch.neuron.get_device_properties().core_id}")
dist.destroy_process_group()
