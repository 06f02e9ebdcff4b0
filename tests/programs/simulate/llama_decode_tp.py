"""Llama-3.3-70B-shaped decoder inference, tensor parallel over every rank (world size = TP degree),
laid out as AWS's NxD Inference runs it on one trn2.48xlarge (TP=64, LNC=2): one prefill of the
prompt, then greedy decode one token at a time against a static KV cache. Written for torchrun.

Meant to be compared with AWS's NxD Inference figure for Llama-3.3-70B on trn2.48xlarge (TP=64,
LNC=2, batch 1, BF16, input 10,000 / output 1,500 tokens: TTFT P50 814.2 ms, TPOT P50 19.6 ms;
aws-neuron-sdk libraries/nxd-inference/tutorials/llama70b_perf_comparison.csv, the figure the
simulator's time model cites): the plan's "prefill" step against TTFT, its "decode" step against
TPOT. Run it as `python -m torch_neuronx.simulate --nproc-per-node 64 --instance trn2.48xlarge
llama_decode_tp.py` (the defaults are that configuration; `--layers 2 --new-tokens 3` to check
it quickly). Collectives per forward: one all_reduce for the embedding, two per layer, one
all_gather of the logits.

Layout (manual Megatron-style TP on plain tensors, as NxD does; no DTensor):
- vocab-parallel embedding: each rank holds vocab/tp rows, zeroes the tokens outside its range, and
  an all_reduce sums the ranks' embeddings;
- column-parallel q/k/v and gate/up (each rank its slice of output features), row-parallel o/down
  followed by an all_reduce (sum) over the TP group;
- KV heads: each rank holds max(1, kv_heads / tp) of them; with tp > kv_heads a KV head is
  replicated on tp / kv_heads ranks (the ranks whose query heads use it), as NxD does;
- a static KV cache of prompt + new-tokens positions per layer (each rank its heads' share),
  allocated once; prefill writes positions 0..prompt-1 and attends causally over the prompt's own
  keys and values (as NxD Inference's context encoding does: the shapes of the NKI flash kernel);
  each decode step writes one position, with index_copy_ at a position tensor, and attends over the
  whole cache with a mask: the decode graph's shapes are the same every step;
- vocab-parallel lm_head on the last position only, then an all_gather of the logits over the TP
  group (tp x vocab/tp values, 256 KiB at the defaults) and the argmax of the whole vocabulary on
  every rank (greedy decode).

By default the model's forward is compiled, `torch.compile(backend="neuron", fullgraph=True,
dynamic=False)`: prefill and decode are two shapes, so two graphs. `--eager` runs it uncompiled.

The program never reads its rank: the ranks differ only through their process group (the vocab
range of a rank comes from a reduce-scatter over the group, see `group_index`), so the simulator
runs rank 0 and the last rank and relabels the others. Weights are drawn from one seed on every
rank (each rank's shard holds the same values): a model of the cost, not of a checkpoint.

Without torchrun (no WORLD_SIZE) it runs on one device for real (init_process_group on a local
store, world size 1) and prints the generated token ids; tiny flags for that:
`--layers 2 --hidden 64 --ffn 128 --heads 4 --kv-heads 2 --vocab 100 --prompt 8 --new-tokens 3`.
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from torch_neuronx.simulate import step

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=80)
parser.add_argument("--hidden", type=int, default=8192)
parser.add_argument("--ffn", type=int, default=28672)
parser.add_argument("--heads", type=int, default=64)
parser.add_argument("--kv-heads", type=int, default=8)
parser.add_argument("--head-dim", type=int, default=None, help="default: hidden / heads (128 at the defaults)")
parser.add_argument("--vocab", type=int, default=128256)
parser.add_argument("--prompt", type=int, default=10000, help="prompt length (prefill tokens)")
parser.add_argument("--new-tokens", type=int, default=1500, help="generated tokens: the prefill's, then one per decode step")
parser.add_argument("--max-length", type=int, default=None,
                    help="positions of the static KV cache (default: prompt + new tokens), as a server sizes it "
                         "for its longest request")
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--rope-theta", type=float, default=500000.0)
parser.add_argument("--dtype", default="bfloat16")
parser.add_argument("--eager", action="store_true", help="run the forward uncompiled")
args = parser.parse_args()
dtype = getattr(torch, args.dtype)

if "WORLD_SIZE" in os.environ:
    dist.init_process_group("neuron")
else:  # one device, no torchrun
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
tp = dist.get_world_size()
group = dist.group.WORLD  # the TP group: every rank
device = torch.device("neuron", torch.neuron.current_device())

head_dim = args.head_dim or args.hidden // args.heads
for name, value in (("--heads", args.heads), ("--ffn", args.ffn), ("--vocab", args.vocab)):
    if value % tp:
        parser.error(f"{name} {value} does not divide among {tp} TP ranks")
if args.kv_heads % tp and tp % args.kv_heads:
    parser.error(f"--kv-heads {args.kv_heads} and {tp} TP ranks: one must divide the other")
q_local = args.heads // tp
kv_local = max(1, args.kv_heads // tp)  # with tp > kv_heads, each KV head is replicated on tp / kv_heads ranks
if q_local % kv_local:
    parser.error(f"{q_local} query heads per rank do not share {kv_local} KV heads evenly")
vocab_local = args.vocab // tp
max_len = args.max_length or args.prompt + args.new_tokens
if max_len < args.prompt + args.new_tokens:
    parser.error(f"--max-length {max_len} is shorter than the prompt and the new tokens "
                 f"({args.prompt + args.new_tokens})")


def all_reduce(x):
    """Sum over the TP group (functional collective: traceable by torch.compile)."""
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group.group_name))


def all_gather(x):
    """The TP group's x stacked on a new leading dimension (tp, *x.shape)."""
    out = torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), tp, group.group_name)
    return torch.ops._c10d_functional.wait_tensor(out).view(tp, *x.shape)


def group_index():
    """This rank's index in the TP group, as a tensor, found through the group: every rank
    reduce-scatters 0..tp-1, so rank i receives tp * i. The program itself never reads its rank."""
    ranks = torch.arange(tp, device=device)
    out = torch.ops._c10d_functional.reduce_scatter_tensor(ranks, "sum", tp, group.group_name)
    return torch.ops._c10d_functional.wait_tensor(out) // tp


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(args.hidden, q_local * head_dim, bias=False)  # column-parallel
        self.wk = nn.Linear(args.hidden, kv_local * head_dim, bias=False)
        self.wv = nn.Linear(args.hidden, kv_local * head_dim, bias=False)
        self.wo = nn.Linear(q_local * head_dim, args.hidden, bias=False)  # row-parallel
        # The static KV cache: this rank's KV heads, every position.
        self.register_buffer("cache_k", torch.empty(args.batch, kv_local, max_len, head_dim), persistent=False)
        self.register_buffer("cache_v", torch.empty(args.batch, kv_local, max_len, head_dim), persistent=False)

    def forward(self, x, pos, cos, sin, mask):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, q_local, head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, kv_local, head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, kv_local, head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.cache_k.index_copy_(2, pos, k)
        self.cache_v.index_copy_(2, pos, v)
        if s > 1:  # the prefill: causal attention over the prompt itself (the flash kernel's shapes)
            keys, values, mask = k, v, None
        else:  # a decode step: the whole cache, masked to the positions written so far
            keys, values = self.cache_k, self.cache_v
        keys = keys.repeat_interleave(q_local // kv_local, dim=1)
        values = values.repeat_interleave(q_local // kv_local, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None)
        return all_reduce(self.wo(out.transpose(1, 2).reshape(b, s, q_local * head_dim)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.hidden, eps=1e-5)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(args.hidden, eps=1e-5)
        self.gate = nn.Linear(args.hidden, args.ffn // tp, bias=False)  # column-parallel
        self.up = nn.Linear(args.hidden, args.ffn // tp, bias=False)  # column-parallel
        self.down = nn.Linear(args.ffn // tp, args.hidden, bias=False)  # row-parallel

    def forward(self, x, pos, cos, sin, mask):
        x = x + self.attention(self.attention_norm(x), pos, cos, sin, mask)
        h = self.ffn_norm(x)
        return x + all_reduce(self.down(F.silu(self.gate(h)) * self.up(h)))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_local, args.hidden)  # vocab-parallel
        self.layers = nn.ModuleList(Block() for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.hidden, eps=1e-5)
        self.lm_head = nn.Linear(args.hidden, vocab_local, bias=False)  # vocab-parallel
        self.register_buffer("vocab_start", torch.zeros((), dtype=torch.long), persistent=False)

    def forward(self, tokens, pos):
        """tokens (batch, s) at positions pos (s,) -> the next token (batch,) after the last one."""
        local = tokens - self.vocab_start
        inside = (local >= 0) & (local < vocab_local)
        x = all_reduce(self.embed(torch.where(inside, local, 0)) * inside.unsqueeze(-1).to(dtype))
        freqs = 1.0 / (args.rope_theta ** (torch.arange(0, head_dim, 2, device=pos.device).float() / head_dim))
        angles = pos.float().unsqueeze(-1) * freqs
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        mask = torch.arange(max_len, device=pos.device) <= pos.unsqueeze(-1)  # (s, max_len): the cache so far
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        logits = self.lm_head(self.norm(x[:, -1]))  # (batch, vocab/tp): the last position only
        logits = all_gather(logits).permute(1, 0, 2).reshape(tokens.shape[0], args.vocab)
        return logits.argmax(-1)


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
    for name, b in model.named_buffers():
        b.zero_()  # the caches: unwritten positions are masked, but must not hold NaNs
    model.vocab_start.copy_(group_index()[0] * vocab_local)
model.eval()

forward = model if args.eager else torch.compile(model, backend="neuron", fullgraph=True, dynamic=False)
torch.manual_seed(1234)
prompt = torch.randint(0, args.vocab, (args.batch, args.prompt)).to(device)  # drawn on the CPU: every rank's
with torch.no_grad():
    with step("prefill", tokens=args.prompt):
        token = forward(prompt, torch.arange(args.prompt, device=device))
    generated = [token]
    pos = torch.tensor([args.prompt], device=device)
    for _ in range(args.new_tokens - 1):
        with step("decode", tokens=1):
            token = forward(token.unsqueeze(-1), pos)
        generated.append(token)
        pos = pos + 1
tokens = torch.stack(generated, dim=-1).cpu()  # (batch, new_tokens)
if not is_fake(tokens):  # under the simulator the values are fake: nothing to print
    print("generated token ids:", tokens.tolist())
dist.destroy_process_group()
