"""Llama-3.1-8B pre-training laid out as AWS's NxD Training benchmark runs it: 32 x trn1.32xlarge,
TP=32 inside each node (LNC=1: 32 cores), DP=32 across the nodes, sequence 8192, global batch 1024,
BF16 compute with an FP32 optimizer (ZeRO-1: each DP rank holds 1/DP of the FP32 master weights and
AdamW state). Written for torchrun.

Meant to be compared with AWS's figure for that run, 47.95 sequences/s (aws-neuron-sdk
about-neuron/benchmarks/trn1/training_data_decoder.csv: Llama-3.1-8B, 32 x trn1.32xlarge, TP=32
DP=32, seq 8192, global batch 1024, BF16 autocast, FP32 optimizer, ZeRO-1; the figure the
simulator's time model cites): the plan's "train" step per sequence. Run it as `python -m
torch_neuronx.simulate --nproc-per-node 32 --nnodes 32 --instance trn1.32xlarge --lnc 1
llama_train_tp_dp.py --checkpoint` (`--layers 2 --global-batch 64` to check it quickly). AWS's run
also uses sequence parallelism and selective activation checkpointing; this program does neither
(`--checkpoint` recomputes whole blocks), and it keeps bf16 weights rather than autocasting.

Layout (manual Megatron-style TP with autograd, on plain tensors):
- Megatron's f (identity forward, all_reduce backward) before the column-parallel q/k/v, gate/up and
  lm_head, and g (all_reduce forward, identity backward) after the row-parallel o/down, both
  torch.autograd.Function over functional collectives on the TP group;
- KV heads: each rank holds max(1, kv_heads / tp) of them (replicated when tp > kv_heads);
- vocab-parallel embedding (each rank vocab/tp rows, an all_reduce over TP) and lm_head;
- the loss is Megatron's vocab-parallel cross entropy on the vocab-parallel logits: an all_reduce
  (max) of the logits' maximum and two all_reduces (sum) over TP, of the target's logit and of the
  sum of exponentials; no rank ever holds the full logits;
- gradient accumulation over global_batch / (dp * micro_batch) microbatches into an FP32 flat
  gradient buffer (each parameter's bf16 .grad is added to it by a post-accumulate-grad hook and
  dropped), then ZeRO-1 on the DP group: the FP32 gradients reduce-scattered over DP
  (dist.reduce_scatter_single, torch 2.13's name for reduce_scatter_tensor), AdamW on each rank's
  FP32 master shard (FP32 exp_avg / exp_avg_sq), and an all_gather (dist.all_gather_single, the
  new name of all_gather_into_tensor) of the updated shards, as bf16, into the bf16 parameters.
No gradient clipping, no learning-rate schedule.

By default each transformer block is compiled on its own, `block.compile(backend="neuron",
fullgraph=True, dynamic=False)` (forward and backward; embedding, lm_head and loss run eager);
`--eager` runs everything uncompiled.

The program never reads its rank: the TP and DP groups come from a DeviceMesh (every rank creates
every group), and a rank's vocab range comes from a reduce-scatter over its TP group (see
`group_index`), so the simulator runs rank 0 and the last rank and relabels the others. Every rank
draws the same weights and the same data from one seed (DP averages equal gradients): a model of
the cost, not of a training run's values.

Without torchrun (no WORLD_SIZE) it runs on one device for real (tp 1, dp 1) and prints each
step's loss; tiny flags for that: `--layers 2 --hidden 64 --ffn 128 --heads 4 --kv-heads 2
--vocab 100 --seq 16 --global-batch 2 --tp 1 --steps 3 --lr 1e-2`.
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.checkpoint import checkpoint

from torch_neuronx.simulate import step

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=32)
parser.add_argument("--hidden", type=int, default=4096)
parser.add_argument("--ffn", type=int, default=14336)
parser.add_argument("--heads", type=int, default=32)
parser.add_argument("--kv-heads", type=int, default=8)
parser.add_argument("--vocab", type=int, default=128256)
parser.add_argument("--seq", type=int, default=8192)
parser.add_argument("--global-batch", type=int, default=1024, help="sequences per optimizer step, over every DP rank")
parser.add_argument("--micro-batch", type=int, default=1, help="sequences per forward/backward on a DP rank")
parser.add_argument("--tp", type=int, default=32)
parser.add_argument("--steps", type=int, default=1)
parser.add_argument("--lr", type=float, default=1.5e-4)
parser.add_argument("--weight-decay", type=float, default=0.01)
parser.add_argument("--rope-theta", type=float, default=500000.0)
parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every block")
parser.add_argument("--sequence-parallel", action="store_true",
                    help="Megatron's sequence parallelism, as AWS's run: between the blocks' parallel regions "
                         "(the norms, the residual adds) each TP rank holds 1/TP of the sequence; all_gather "
                         "before and reduce_scatter after each parallel region instead of all_reduce")
parser.add_argument("--dtype", default="bfloat16", help="the parameters' and the compute's dtype")
parser.add_argument("--eager", action="store_true", help="run the blocks uncompiled")
args = parser.parse_args()
dtype = getattr(torch, args.dtype)

if "WORLD_SIZE" in os.environ:
    dist.init_process_group("neuron")
else:  # one device, no torchrun
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
world = dist.get_world_size()
if world % args.tp:
    parser.error(f"--tp {args.tp} does not divide the world size {world}")
tp, dp = args.tp, world // args.tp
if args.global_batch % (dp * args.micro_batch):
    parser.error(f"--global-batch {args.global_batch} is not a multiple of dp x micro-batch = {dp * args.micro_batch}")
microbatches = args.global_batch // (dp * args.micro_batch)
device = torch.device("neuron", torch.neuron.current_device())
mesh = init_device_mesh("neuron", (dp, tp), mesh_dim_names=("dp", "tp"))  # TP inside a node, DP across
tp_group, dp_group = mesh.get_group("tp"), mesh.get_group("dp")

head_dim = args.hidden // args.heads
for name, value in (("--heads", args.heads), ("--ffn", args.ffn), ("--vocab", args.vocab)):
    if value % tp:
        parser.error(f"{name} {value} does not divide among {tp} TP ranks")
if args.kv_heads % tp and tp % args.kv_heads:
    parser.error(f"--kv-heads {args.kv_heads} and --tp {tp}: one must divide the other")
q_local = args.heads // tp
kv_local = max(1, args.kv_heads // tp)
if q_local % kv_local:
    parser.error(f"{q_local} query heads per rank do not share {kv_local} KV heads evenly")
vocab_local = args.vocab // tp
_ops = torch.ops._c10d_functional


def all_reduce(x, op="sum", group=tp_group):
    return _ops.wait_tensor(_ops.all_reduce(x, op, group.group_name))


def _along_sequence(collective, x):
    """A functional collective on dim 1 (the sequence) of a (batch, seq, hidden) tensor."""
    return _ops.wait_tensor(collective(x.transpose(0, 1).contiguous())).transpose(0, 1)


def gather_sequence(x):
    return _along_sequence(lambda t: _ops.all_gather_into_tensor(t, tp, tp_group.group_name), x)


def scatter_sequence(x):
    return _along_sequence(lambda t: _ops.reduce_scatter_tensor(t, "sum", tp, tp_group.group_name), x)


class GatherFromSP(torch.autograd.Function):
    """Sequence parallelism's entry to a parallel region: all_gather forward, reduce_scatter backward."""

    @staticmethod
    def forward(ctx, x):
        return gather_sequence(x)

    @staticmethod
    def backward(ctx, grad):
        return scatter_sequence(grad)


class ScatterToSP(torch.autograd.Function):
    """Sequence parallelism's exit from a parallel region: reduce_scatter forward, all_gather backward."""

    @staticmethod
    def forward(ctx, x):
        return scatter_sequence(x)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad)


# The entry to and exit from a tensor-parallel region (Megatron's f and g, or sequence parallelism's).
def enter_tp(x):
    return GatherFromSP.apply(x) if args.sequence_parallel else CopyToTP.apply(x)


def leave_tp(x):
    return ScatterToSP.apply(x) if args.sequence_parallel else ReduceFromTP.apply(x)


class CopyToTP(torch.autograd.Function):
    """Megatron's f, before a column-parallel layer: identity forward, all_reduce of the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad)


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g, after a row-parallel layer: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        return all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def group_index():
    """This rank's index in its TP group, as a tensor, found through the group: every rank
    reduce-scatters 0..tp-1, so rank i receives tp * i. The program itself never reads its rank."""
    ranks = torch.arange(tp, device=device)
    return _ops.wait_tensor(_ops.reduce_scatter_tensor(ranks, "sum", tp, tp_group.group_name)) // tp


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.hidden, eps=1e-5)
        self.wq = nn.Linear(args.hidden, q_local * head_dim, bias=False)  # column-parallel
        self.wk = nn.Linear(args.hidden, kv_local * head_dim, bias=False)
        self.wv = nn.Linear(args.hidden, kv_local * head_dim, bias=False)
        self.wo = nn.Linear(q_local * head_dim, args.hidden, bias=False)  # row-parallel
        self.ffn_norm = nn.RMSNorm(args.hidden, eps=1e-5)
        self.gate = nn.Linear(args.hidden, args.ffn // tp, bias=False)  # column-parallel
        self.up = nn.Linear(args.hidden, args.ffn // tp, bias=False)  # column-parallel
        self.down = nn.Linear(args.ffn // tp, args.hidden, bias=False)  # row-parallel

    def forward(self, x, cos, sin):
        h = enter_tp(self.attention_norm(x))
        b, s, _ = h.shape
        q = self.wq(h).view(b, s, q_local, head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, kv_local, head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, kv_local, head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(q_local // kv_local, dim=1)
        v = v.repeat_interleave(q_local // kv_local, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + leave_tp(self.wo(out.transpose(1, 2).reshape(b, s, q_local * head_dim)))
        h = enter_tp(self.ffn_norm(x))
        return x + leave_tp(self.down(F.silu(self.gate(h)) * self.up(h)))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_local, args.hidden)  # vocab-parallel
        self.layers = nn.ModuleList(Block() for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.hidden, eps=1e-5)
        self.lm_head = nn.Linear(args.hidden, vocab_local, bias=False)  # vocab-parallel
        self.register_buffer("vocab_start", torch.zeros((), dtype=torch.long), persistent=False)

    def forward(self, tokens):
        """tokens (batch, seq) -> this rank's vocab-parallel logits (batch, seq, vocab/tp)."""
        local = tokens - self.vocab_start
        inside = (local >= 0) & (local < vocab_local)
        x = leave_tp(self.embed(torch.where(inside, local, 0)) * inside.unsqueeze(-1).to(dtype))
        freqs = 1.0 / (args.rope_theta ** (torch.arange(0, head_dim, 2, device=tokens.device).float() / head_dim))
        angles = torch.outer(torch.arange(tokens.shape[1], device=tokens.device).float(), freqs)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if args.checkpoint else layer(x, cos, sin)
        return self.lm_head(enter_tp(self.norm(x)))


def vocab_parallel_cross_entropy(logits, targets, vocab_start):
    """Megatron's cross entropy on vocab-parallel logits: the mean over tokens, equal on every TP rank."""
    logits = logits.float()
    shifted = logits - all_reduce(logits.detach().amax(-1, keepdim=True), "max")
    local = targets - vocab_start
    inside = (local >= 0) & (local < vocab_local)
    picked = shifted.gather(-1, torch.where(inside, local, 0).unsqueeze(-1)).squeeze(-1) * inside
    picked = ReduceFromTP.apply(picked)
    sum_exp = ReduceFromTP.apply(shifted.exp().sum(-1))
    return (sum_exp.log() - picked).mean()


with torch.device("meta"):
    model = Llama().to(dtype)
model.to_empty(device=device)
with torch.no_grad():
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    model.vocab_start.copy_(group_index()[0] * vocab_local)
if not args.eager:
    for layer in model.layers:
        layer.compile(backend="neuron", fullgraph=True, dynamic=False)

# ZeRO-1. One flat FP32 gradient buffer (padded to a multiple of DP) with a view per parameter.
params = list(model.parameters())
numel = sum(p.numel() for p in params)
shard = -(-numel // dp)
main_grad = torch.zeros(shard * dp, dtype=torch.float32, device=device)
offsets = [sum(p.numel() for p in params[:j]) for j in range(len(params))]


def flat_views(flat):
    """Each parameter's view of a flat buffer (its place in the ZeRO-1 layout)."""
    return [flat[o:o + p.numel()].view_as(p) for o, p in zip(offsets, params)]


views = flat_views(main_grad)


def accumulate(view):
    def hook(p):
        view.add_(p.grad)
        p.grad = None
    return hook


for p, view in zip(params, views):
    p.register_post_accumulate_grad_hook(accumulate(view))

with torch.no_grad():
    # The FP32 master shard. Every DP rank holds the same parameters, so the reduce-scatter of their
    # sum over DP, divided by DP, is this rank's slice of them (exact: dp equal bf16 values summed
    # in fp32), without the program reading its rank.
    flat = torch.zeros(shard * dp, dtype=torch.float32, device=device)
    torch._foreach_copy_(flat_views(flat), params)
    master = torch.empty(shard, dtype=torch.float32, device=device)
    dist.reduce_scatter_single(master, flat, group=dp_group)
    master.div_(dp)
    del flat
master = nn.Parameter(master)
optimizer = torch.optim.AdamW([master], lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.weight_decay)
gathered = torch.empty(shard * dp, dtype=dtype, device=device)

torch.manual_seed(1234)
data = torch.randint(0, args.vocab, (microbatches, args.micro_batch, args.seq + 1))  # the same on every rank
for i in range(args.steps):
    with step("train", sequences=args.global_batch):
        total = torch.zeros((), dtype=torch.float32, device=device)
        for m in range(microbatches):
            tokens = data[m].to(device)
            loss = vocab_parallel_cross_entropy(model(tokens[:, :-1]), tokens[:, 1:], model.vocab_start)
            (loss / microbatches).backward()
            total += loss.detach()
        with torch.no_grad():
            grad = torch.empty(shard, dtype=torch.float32, device=device)
            dist.reduce_scatter_single(grad, main_grad, group=dp_group)
            master.grad = grad.div_(dp)
            optimizer.step()
            master.grad = None
            main_grad.zero_()
            dist.all_gather_single(gathered, master.detach().to(dtype), group=dp_group)
            torch._foreach_copy_(params, flat_views(gathered))
            dist.all_reduce(total, group=dp_group)
            loss = total / (microbatches * dp)  # the step's mean loss (before the update)
    if not is_fake(loss):  # under the simulator the values are fake: nothing to print
        print(f"step {i} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
