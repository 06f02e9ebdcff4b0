"""Scaled dot-product attention as matmuls and a softmax (TorchNeuron's fallback when no flash
kernel applies), forward and backward.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import math

import torch


def _attention_scores(query, key, attn_bias, is_causal, scale):
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if heads != kv_heads:  # grouped-query attention: each key/value head serves heads // kv_heads queries
        key = key.repeat_interleave(heads // kv_heads, dim=-3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        keep = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_bias is not None:
        scores = (scores.masked_fill(~attn_bias, float("-inf")) if attn_bias.dtype == torch.bool
                  else scores + attn_bias)
    return scores, scale


def _repeat_heads(t, heads):
    return t.repeat_interleave(heads // t.shape[-3], dim=-3) if t.shape[-3] != heads else t


def _sum_heads(grad, kv_heads):
    """A gradient over repeated key/value heads, summed back to each head."""
    heads = grad.shape[-3]
    if heads == kv_heads:
        return grad
    return grad.unflatten(-3, (kv_heads, heads // kv_heads)).sum(-3)


def attention_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                      return_debug_mask=False, *, scale=None):
    """softmax(q k^T * scale + bias) v, and the log-sum-exp of each row (what the backward needs):
    TorchNeuron's fallback for its fused attention when no NKI kernel applies."""
    if dropout_p > 0.0:
        return NotImplemented
    scores, _ = _attention_scores(query, key, attn_bias, is_causal, scale)
    logsumexp = torch.logsumexp(scores, -1)
    weights = torch.exp(scores - logsumexp.unsqueeze(-1))
    output = torch.matmul(weights, _repeat_heads(value, query.shape[-3]))
    empty = query.new_empty(0)
    return (output, logsumexp, empty, empty, query.shape[-2], key.shape[-2], empty.to(torch.int64),
            empty.to(torch.int64), empty)


def attention_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                       cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    """The attention's gradients, from the saved output and log-sum-exp: with P the weights,
    dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = dS K * scale, dK = dS^T Q * scale."""
    if dropout_p > 0.0:
        return NotImplemented
    heads = query.shape[-3]
    scores, scale = _attention_scores(query, key, attn_bias, is_causal, scale)
    weights = torch.exp(scores - logsumexp.unsqueeze(-1))
    value_full, key_full = _repeat_heads(value, heads), _repeat_heads(key, heads)
    grad_weights = torch.matmul(grad_out, value_full.transpose(-2, -1))
    grad_scores = weights * (grad_weights - (grad_out * out).sum(-1, keepdim=True))
    grad_query = torch.matmul(grad_scores, key_full) * scale if grad_input_mask[0] else None
    grad_key = (_sum_heads(torch.matmul(grad_scores.transpose(-2, -1), query) * scale, key.shape[-3])
                if grad_input_mask[1] else None)
    grad_value = (_sum_heads(torch.matmul(weights.transpose(-2, -1), grad_out), value.shape[-3])
                  if grad_input_mask[2] else None)
    grad_bias = None
    if grad_input_mask[3] and attn_bias is not None and attn_bias.dtype != torch.bool:
        grad_bias = _sum_to(grad_scores, attn_bias.shape)
    return grad_query, grad_key, grad_value, grad_bias


def _sum_to(t, shape):
    """``t`` summed over the dimensions a tensor of ``shape`` was broadcast along."""
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and t.shape[lead + i] != 1]
    return t.sum(dims, keepdim=True).reshape(shape) if dims else t
