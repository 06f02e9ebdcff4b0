"""A Llama-style decoder trained one step with tensor parallelism inside each group of TP ranks and
FSDP2 across the groups, written for torchrun. Built on the meta device, sharded, then given
weights; `--layers/--hidden/...` shrink it (the default is Llama 3 8B's shape). With `--ddp` (and
`--tp 1`) data parallelism is DDP instead: every rank holds the whole model on its own core,
neuron:<LOCAL_RANK>, and DDP(device_ids=[local rank]) all-reduces the gradients in buckets as the
backward reaches them (Llama 3.2 1B: --layers 16 --hidden 2048 --ffn 8192 --vocab 128256).

Top-level results, which `--numerics` compares with one device: `loss` (before the first step) and
`loss_after` (after the SGD steps, one by default: the gradients' reduction and the update are in it).
On one rank (WORLD_SIZE=1) it runs un-sharded: the single-device reference. Every rank trains on
the same batch (drawn on the CPU from one seed), so FSDP2 averages equal gradients: the check covers
sharding, gathering, reduce-scattering and the update, not averaging different data."""
import argparse
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=32)
parser.add_argument("--hidden", type=int, default=4096)
parser.add_argument("--ffn", type=int, default=14336)
parser.add_argument("--heads", type=int, default=32)
parser.add_argument("--kv-heads", type=int, default=8)
parser.add_argument("--vocab", type=int, default=128256)
parser.add_argument("--seq", type=int, default=2048)
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--tp", type=int, default=8)
parser.add_argument("--dtype", default="bfloat16")
parser.add_argument("--ddp", action="store_true", help="data parallel by DDP instead of FSDP2 (with --tp 1)")
parser.add_argument("--steps", type=int, default=1, help="SGD steps (DDP rebuilds its buckets after the first)")
args = parser.parse_args()
if args.ddp and args.tp != 1:
    parser.error("--ddp replicates the whole model on every rank: give --tp 1")
dtype = getattr(torch, args.dtype)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = args.hidden // args.heads
        self.wq = nn.Linear(args.hidden, args.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.hidden, args.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.hidden, args.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.heads * self.head_dim, args.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds its share of them.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.hidden)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(args.hidden)
        self.w1 = nn.Linear(args.hidden, args.ffn, bias=False)
        self.w3 = nn.Linear(args.hidden, args.ffn, bias=False)
        self.w2 = nn.Linear(args.ffn, args.hidden, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.layers = nn.ModuleList(Block() for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.hidden)
        self.output = nn.Linear(args.hidden, args.vocab, bias=False)

    def forward(self, tokens):
        head_dim = args.hidden // args.heads
        freqs = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=tokens.device).float() / head_dim))
        angles = torch.outer(torch.arange(tokens.shape[1], device=tokens.device).float(), freqs)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


dist.init_process_group("neuron")
world = dist.get_world_size()
device = torch.device("neuron", torch.neuron.current_device())
with torch.device("meta"):
    model = Llama().to(dtype)

if world > 1 and not args.ddp:
    tp = min(args.tp, world)
    dp = world // tp
    # A 1-D mesh when one of the two is 1 (--numerics handles 1-D meshes; see README).
    if dp == 1 or tp == 1:
        mesh1 = init_device_mesh("neuron", (world,), mesh_dim_names=("tp" if dp == 1 else "dp",))
        mesh = {"tp": mesh1 if dp == 1 else None, "dp": mesh1 if tp == 1 else None}
    else:
        mesh = init_device_mesh("neuron", (dp, tp), mesh_dim_names=("dp", "tp"))
    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    for layer in model.layers:
        if tp > 1:
            parallelize_module(layer, mesh["tp"], plan)
        if dp > 1:
            fully_shard(layer, mesh=mesh["dp"])
    if dp > 1:
        fully_shard(model, mesh=mesh["dp"])
model.to_empty(device=device)

# Weights drawn on the CPU, parameter by parameter from its own seed, then sharded like the
# parameter: every layout (and one device) holds the same values.
with torch.no_grad():
    for i, (name, p) in enumerate(model.named_parameters()):
        torch.manual_seed(i)
        if name.endswith("norm.weight"):
            full = torch.ones(p.shape, dtype=dtype)
        else:
            full = (torch.randn(p.shape) / math.sqrt(p.shape[-1])).to(dtype)
        if isinstance(p, DTensor):
            p.copy_(distribute_tensor(full, p.device_mesh, p.placements))
        else:
            p.copy_(full)

if args.ddp and world > 1:
    model = DistributedDataParallel(model, device_ids=[device.index])

torch.manual_seed(1234)
tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1)).to(device)
inputs, targets = tokens[:, :-1], tokens[:, 1:]
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
loss = None
for _ in range(args.steps):
    logits = model(inputs)
    step_loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    step_loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    del logits
    loss = step_loss if loss is None else loss
with torch.no_grad():
    loss_after = F.cross_entropy(model(inputs).float().flatten(0, 1), targets.flatten())
loss, loss_after = loss.detach(), loss_after.detach()
dist.destroy_process_group()
