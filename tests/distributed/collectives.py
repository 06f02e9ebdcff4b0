"""Run under torchrun (any number of processes; PG_BACKEND "neuron", or empty for no backend
argument). Every rank binds to its own core, and every collective of the `neuron` group gives on
neuron tensors exactly what Gloo gives on CPU tensors (the oracle: a Gloo group of the same ranks,
since the neuron group takes neuron tensors only, as TorchNeuron's), in place where torch's contract
is in place, within TorchNeuron's rules (tests/distributed/torchneuron_rules.py checks those). Each
rank writes "<rank> <backend> <checks> node=<torchrun's node rank> core=<its core>" to RESULT_DIR.
Used by tests/test_distributed.py."""
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
cpu_group = dist.new_group(backend="gloo")  # the oracle's
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
    """run(*inputs, group=...) with inputs built on neuron (the neuron group: None, the default) and on
    CPU (the Gloo group); run returns the tensors to compare."""
    results = []
    for device, group in ((dev, None), ("cpu", cpu_group)):
        inputs = []
        for make in make_inputs:
            made = make()
            inputs.append([t.to(device) for t in made] if isinstance(made, list) else made.to(device))
        results.append(run(*inputs, group=group))
    same(name, *results)


def mine(n=4, dtype=torch.float32):
    return lambda: (torch.arange(n, dtype=torch.float32) + 1 + rank * n).to(dtype)


def zeros(n, dtype=torch.float32):
    return lambda: torch.zeros(n, dtype=dtype)


def listed(k, n):
    return lambda: [torch.zeros(n) for _ in range(k)]


def in_place(op):
    def run(t, group):
        ptr = t.data_ptr()
        op(t, group)
        assert t.data_ptr() == ptr, "a collective replaced its in-place tensor"
        return t
    return run


# all_reduce: the reduce ops TorchNeuron's group takes, and AVG (SUM, then a division on the device;
# Gloo has none, so its oracle divides Gloo's SUM).
for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
    on_both(f"all_reduce {op}", in_place(lambda t, g, op=op: dist.all_reduce(t, op=op, group=g)), mine())
for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.uint8):
    on_both(f"all_reduce {dtype}", in_place(lambda t, g: dist.all_reduce(t, group=g)), mine(dtype=dtype))
for dtype in (torch.float32, torch.int32):  # integers truncate, as on CUDA
    avg = mine(dtype=dtype)().to(dev)
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    summed = mine(dtype=dtype)()
    dist.all_reduce(summed, group=cpu_group)
    same(f"all_reduce AVG {dtype}", avg, summed / world if dtype.is_floating_point else summed // world)
on_both("all_reduce async", in_place(lambda t, g: dist.all_reduce(t, async_op=True, group=g).wait()), mine())

# gathers, scatters, reductions to one rank
on_both("all_gather", lambda out, t, group: (dist.all_gather(out, t, group=group), out)[1], listed(world, 4), mine())
on_both("all_gather_into_tensor", lambda out, t, group: (dist.all_gather_into_tensor(out, t, group=group), out)[1],
        zeros(4 * world), mine())
# Shapes of other ranks (nn.SyncBatchNorm's (1, world x n) output): TorchNeuron squeezes both.
on_both("all_gather_into_tensor squeezed",
        lambda out, t, group: (dist.all_gather_into_tensor(out.view(1, -1) if group is None else out, t, group=group),
                               out)[1], zeros(4 * world), mine())
on_both("reduce_scatter", lambda out, ts, group: (dist.reduce_scatter(out, ts, group=group), out)[1], zeros(3),
        lambda: [torch.arange(3.0) * (r + 1) + rank for r in range(world)])
on_both("reduce_scatter_tensor", lambda out, t, group: (dist.reduce_scatter_tensor(out, t, group=group), out)[1],
        zeros(2), mine(2 * world))
on_both("broadcast", in_place(lambda t, g: dist.broadcast(t, src=world - 1, group=g)), mine())
reduced = mine()().to(dev)
dist.reduce(reduced, dst=0, op=dist.ReduceOp.MAX)
oracle = mine()()
dist.all_reduce(oracle, op=dist.ReduceOp.MAX, group=cpu_group)
same("reduce (the root's result; the others' unchanged)", reduced, oracle if rank == 0 else mine()())
on_both("gather", lambda t, out, group: (dist.gather(t, out if rank == 0 else None, dst=0, group=group), out)[1],
        mine(), listed(world, 4))
on_both("scatter", lambda out, ts, group: (dist.scatter(out, ts if rank == 0 else None, src=0, group=group), out)[1],
        zeros(4), lambda: [torch.full((4,), 10.0 * r) for r in range(world)])
if world in (4, 8, 16):  # the sizes Trainium's all_to_all runs on
    on_both("all_to_all", lambda outs, ins, group: (dist.all_to_all(outs, ins, group=group), outs)[1],
            listed(world, 2), lambda: [torch.full((2,), 10.0 * rank + r) for r in range(world)])
    on_both("all_to_all_single", lambda out, t, group: (dist.all_to_all_single(out, t, group=group), out)[1],
            zeros(2 * world), mine(2 * world))

# coalesced forms
on_both("all_reduce_coalesced", lambda a, b, group: (dist.all_reduce_coalesced([a, b], group=group), [a, b])[1],
        mine(), mine(3))


def coalesced_gather(out, t, group):
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        dist.all_gather_into_tensor(out, t, group=group)
    cm.wait()
    return out


def coalesced_reduce_scatter(out, t, group):
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        dist.reduce_scatter_tensor(out, t, group=group)
    cm.wait()
    return out


on_both("all_gather_into_tensor coalesced", coalesced_gather, zeros(4 * world), mine())
on_both("reduce_scatter_tensor coalesced", coalesced_reduce_scatter, zeros(2), mine(2 * world))

# point to point, between every pair of neighbours
nxt, prv = (rank + 1) % world, (rank - 1) % world


def ring(t, out, group):
    if world == 1:
        return out.copy_(t)
    if rank % 2 == 0:
        dist.send(t, nxt, group=group); dist.recv(out, prv, group=group)
    else:
        dist.recv(out, prv, group=group); dist.send(t, nxt, group=group)
    return out


def ring_async(t, out, group):
    ops = [dist.P2POp(dist.isend, t, nxt, group=group), dist.P2POp(dist.irecv, out, prv, group=group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out


on_both("send/recv", ring, mine(), zeros(4))
on_both("isend/irecv", ring_async, mine(), zeros(4))

# functional collectives (what DTensor and compiled graphs use)
world_of = lambda group: dist.group.WORLD if group is None else group  # noqa: E731
on_both("funcol all_reduce", lambda t, group: funcol.all_reduce(t, "sum", world_of(group)).wait(), mine())
on_both("funcol all_reduce avg", lambda t, group: funcol.all_reduce(t, "avg", world_of(group)).wait()
        if group is None else funcol.all_reduce(t, "sum", group).wait() / world, mine())
on_both("funcol all_gather_tensor", lambda t, group: funcol.all_gather_tensor(t, 0, world_of(group)).wait(), mine())
on_both("funcol reduce_scatter_tensor",
        lambda t, group: funcol.reduce_scatter_tensor(t, "sum", 0, world_of(group)).wait(), mine(2 * world))
if world in (4, 8, 16):  # one row per rank: split sizes all ones, the only ones TorchNeuron takes
    on_both("funcol all_to_all_single",
            lambda t, group: funcol.all_to_all_single(t, None, None, world_of(group)).wait(), mine(world))

# objects, barriers, a subgroup
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank})
assert objects == [{"rank": r} for r in range(world)], objects
dist.barrier()
if world > 1:
    pairs = {None: dist.new_group([0, 1]), cpu_group: dist.new_group([0, 1], backend="gloo")}
    if rank < 2:
        on_both("subgroup all_reduce", in_place(lambda t, g: dist.all_reduce(t, group=pairs[g])), mine())

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:  # not stdout: ranks interleave
    f.write(f"{rank} {dist.get_backend()} {len(checks)} node={os.environ['GROUP_RANK']} "
            f"core={torch.neuron.get_device_properties().core_id}")
dist.destroy_process_group()
