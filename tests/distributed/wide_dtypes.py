"""int64 and float64 in collectives, under torchrun: what TorchNeuron's process group sends.

Run with TORCH_NEURONX_EAGER_SEMANTICS=trainium: int64 values are sent as int32 (wrapped) and float64 as
float32, so all_reduce and all_gather give what int32/float32 collectives give, computed here on CPU from
every rank's values (the oracle). Without it: int64 and float64 exactly, as Gloo on CPU. Each rank
writes its report to $RESULT_DIR/rank<r>.txt.

With OBSERVE=1 each rank observes itself for the readiness report and writes its int64-range rows:
DDP's construction all_gathers int64 metadata into buffers whose values nobody has written yet (Gloo
fills them after the call returns); those are no finding, while the all_reduce of values beyond int32
is one, on every rank, and so is the all_gather that sends them.
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
observe = os.environ.get("OBSERVE") == "1"
if observe:
    from torch_neuronx import diagnostics

    diagnostics.start()
trainium = os.environ.get("TORCH_NEURONX_EAGER_SEMANTICS") == "trainium"
N = "neuron"
checks = 0


def check(got, expected):
    global checks
    assert got.device.type == N and got.dtype == expected.dtype, (got, expected)
    assert torch.equal(got.cpu(), expected), (got.cpu(), expected)
    checks += 1


def each_rank(t):
    return [t + r for r in range(world)]


big = torch.tensor([2**31 + 10, 3], dtype=torch.int64) * (rank + 1)
fine = torch.tensor([1.0 + 1e-12, 2.5], dtype=torch.float64) * (rank + 1)
values_big = [torch.tensor([2**31 + 10, 3], dtype=torch.int64) * (r + 1) for r in range(world)]
values_fine = [torch.tensor([1.0 + 1e-12, 2.5], dtype=torch.float64) * (r + 1) for r in range(world)]
if trainium:
    expected_sum = sum(v.to(torch.int32) for v in values_big).to(torch.int64)
    expected_fine = sum(v.float() for v in values_fine).double()
    expected_gather = [v.to(torch.int32).to(torch.int64) for v in values_big]
else:
    expected_sum, expected_fine, expected_gather = sum(values_big), sum(values_fine), values_big

t = big.to(N)
dist.all_reduce(t)
check(t, expected_sum)
f = fine.to(N)
dist.all_reduce(f)
check(f, expected_fine)
gathered = [torch.empty(2, dtype=torch.int64, device=N) for _ in range(world)]
sent = big.to(N)
dist.all_gather(gathered, sent)
for got, want in zip(gathered, expected_gather):
    check(got, want)
check(sent, big)  # the caller's tensor is not changed by sending it

model = DDP(torch.nn.Linear(8, 8).to(N))  # its construction all_gathers int64 metadata
model(torch.ones(2, 8, device=N)).sum().backward()
checks += 1

rows = ""
if observe:
    import torch_neuronx

    report = torch_neuronx.report()
    rows = " " + ";".join(f"{r.line}:{','.join(r.ops)}" for r in report.findings if r.kind == "int64-range")
with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as out:
    out.write(f"{rank} {checks}{rows}")
dist.destroy_process_group()
