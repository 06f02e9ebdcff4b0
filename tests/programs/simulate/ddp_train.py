"""The CUDA idiom of a torchrun program, on neuron: "my device is my local rank".

    torchrun --nproc_per_node 4 ddp_train.py
    python -m torch_neuronx.simulate --nproc-per-node 4 --instance trn2.3xlarge ddp_train.py

An MLP trained with DDP(device_ids=[local_rank]); each rank takes its slice of a global batch drawn
on the CPU from one seed, so the steps equal full-batch steps on one device. `losses` holds each
step's global loss (the ranks' losses averaged by an all_reduce), the value a training loop logs
and the one `--numerics` compares with one device (which takes the whole global batch); with
RESULT_DIR set each rank writes its losses, final weights and DDP's bucket sizes there. Flags choose DDP's options (bucket size, gradient_as_bucket_view, a comm
hook, no_sync steps, static_graph); `--hard-coded-device` writes "neuron:0" instead of the local
rank, which fails on every local rank above 0, on Trainium as here.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, default=32)
parser.add_argument("--layers", type=int, default=3)
parser.add_argument("--global-batch", type=int, default=32, help="samples per step, over all ranks")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
parser.add_argument("--gradient-as-bucket-view", action="store_true")
parser.add_argument("--static-graph", action="store_true")
parser.add_argument("--hook", choices=("none", "fp16", "bf16", "bf16-wrapped"), default="none",
                    help="a comm hook: torch's fp16_compress_hook or bf16_compress_hook (which DDP registers only "
                         "for CUDA with NCCL or XPU: refused on neuron, on Trainium too), or bf16 through a wrapper")
parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step; all but the last under no_sync()")
parser.add_argument("--hard-coded-device", action="store_true", help='"neuron:0" instead of the local rank')
args = parser.parse_args()

dist.init_process_group("neuron")
local_rank = int(os.environ["LOCAL_RANK"])
device = "neuron:0" if args.hard_coded_device else f"neuron:{local_rank}"
torch.neuron.set_device(torch.device(device).index)
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
layers = []
for _ in range(args.layers):
    layers += [nn.Linear(args.hidden, args.hidden), nn.Tanh()]
model = nn.Sequential(*layers, nn.Linear(args.hidden, 1)).to(device)
ddp = DDP(model, device_ids=[local_rank], bucket_cap_mb=args.bucket_cap_mb, static_graph=args.static_graph,
          gradient_as_bucket_view=args.gradient_as_bucket_view)
if args.hook == "bf16-wrapped":
    ddp.register_comm_hook(None, lambda state, bucket: default_hooks.bf16_compress_hook(state, bucket))
elif args.hook != "none":
    ddp.register_comm_hook(None, getattr(default_hooks, f"{args.hook}_compress_hook"))
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)

batch = args.global_batch // world
micro = batch // args.accumulate
losses = []
for step in range(args.steps):
    inputs = torch.randn(args.global_batch, args.hidden)  # the global batch, the same on every rank
    targets = inputs.sum(1, keepdim=True).sin()
    mine = slice(rank * batch, (rank + 1) * batch)
    step_loss = torch.zeros((), device=device)
    for k in range(args.accumulate):
        part = slice(mine.start + k * micro, mine.start + (k + 1) * micro)
        syncing = k == args.accumulate - 1
        with ddp.no_sync() if not syncing else torch.enable_grad():
            loss = F.mse_loss(ddp(inputs[part].to(device)), targets[part].to(device)) / args.accumulate
            loss.backward()
        step_loss += loss.detach()
    optimizer.step()
    optimizer.zero_grad()
    dist.all_reduce(step_loss)
    losses.append(step_loss / world)
losses = torch.stack(losses)
weights = torch.cat([p.detach().flatten() for p in model.parameters()])

if os.environ.get("RESULT_DIR"):
    logged = ddp._get_ddp_logging_data()  # DDP's buckets in bytes, as built and as rebuilt after the first backward
    buckets = [[int(n) for n in logged.get(key, logged["bucket_sizes"]).replace(",", " ").split()]
               for key in ("bucket_sizes", "rebuilt_bucket_sizes")]
    torch.save({"losses": losses.cpu(), "weights": weights.cpu(), "bucket_sizes": buckets,
                "peak_bytes": torch.neuron.max_memory_allocated()},
               os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.pt"))
dist.destroy_process_group()
