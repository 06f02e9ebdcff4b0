"""Attention in a compiled graph as TorchNeuron's compiler takes it, for costing: its NKI
flash-attention kernel when the shapes allow (forward: query length a multiple of 128, key length of
512, head dimension at most 128, no mask, no dropout; backward: both lengths multiples of 512), and
its plain decomposition otherwise (scores and probabilities as tensors, saved for the backward when it
trains). A kernel call is one op here, :func:`nki_flash_attention`, whose backward saves only the
query, key, value, output and log-sum-exp, as the kernel's does (torch_neuronx's
``neuron_dynamo_backend/decompositions.py``, ``sdpa_fused_overrideable``). The plan simulator and the
readiness report's graph replay both rewrite Dynamo's graph with :func:`as_on_trainium`.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("neuron_simulate::_scaled_dot_product_nki_flash_attention", mutates_args=())
def nki_flash_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp): only ever run on fake tensors, which have no values."""
    raise RuntimeError("the simulator's flash-attention stand-in runs on fake tensors only")


@nki_flash_attention.register_fake
def _(query, key, value, is_causal, scale):
    return query.new_empty((*query.shape[:-1], value.shape[-1])), query.new_empty(query.shape[:-1],
                                                                                dtype=torch.float32)


@torch.library.custom_op("neuron_simulate::_scaled_dot_product_nki_flash_attention_backward", mutates_args=())
def nki_flash_attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 out: torch.Tensor, lse: torch.Tensor, is_causal: bool,
                                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise RuntimeError("the simulator's flash-attention stand-in runs on fake tensors only")


@nki_flash_attention_backward.register_fake
def _(grad_out, query, key, value, out, lse, is_causal, scale):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup(ctx, inputs, output):
    query, key, value, ctx.is_causal, ctx.scale = inputs
    ctx.save_for_backward(query, key, value, *output)


def _backward(ctx, grad_out, _grad_lse):
    query, key, value, out, lse = ctx.saved_tensors
    return (*nki_flash_attention_backward(grad_out, query, key, value, out, lse, ctx.is_causal, ctx.scale),
            None, None)


nki_flash_attention.register_autograd(_backward, setup_context=_setup)


def _flash_applies(query, key, value, mask, dropout, training: bool) -> bool:
    """TorchNeuron's conditions for its NKI flash-attention kernel (forward, and backward when it trains)."""
    if mask is not None or dropout or query.dim() != 4 or key.shape != value.shape:
        return False
    length, keys, dim = query.shape[-2], key.shape[-2], query.shape[-1]
    ok = length % 128 == 0 and keys % 512 == 0 and dim <= 128
    return ok and (not training or (length % 512 == 0 and keys % 512 == 0))


def _sdpa_as_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads:  # GQA: the kernel gets the KV heads repeated, as TorchNeuron's decomposition does
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return nki_flash_attention(query, key, value, is_causal, scale)[0]


def _sdpa_as_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return torch.ops.aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal,
                                                             scale=scale, enable_gqa=enable_gqa)[0]


def as_on_trainium(gm) -> None:
    """Each SDPA call of a Dynamo graph as TorchNeuron's compiler takes it: its flash kernel where the
    shapes allow, else its plain decomposition (matmuls and a softmax)."""
    sdpa = torch._C._nn.scaled_dot_product_attention
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (sdpa, torch.nn.functional.scaled_dot_product_attention):
            continue
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        given = {**dict(zip(names, node.args)), **node.kwargs}
        meta = [getattr(given.get(n), "meta", {}).get("example_value") for n in names[:3]]
        if any(m is None for m in meta):
            continue
        training = torch.is_grad_enabled() and any(m.requires_grad for m in meta)
        flash = _flash_applies(*meta, given.get("attn_mask"), given.get("dropout_p", 0.0), training)
        node.target, node.args, node.kwargs = _sdpa_as_flash if flash else _sdpa_as_math, (), given
    gm.recompile()


