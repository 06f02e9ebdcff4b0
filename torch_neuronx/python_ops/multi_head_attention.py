"""``aten::_native_multi_head_attention``, nn.MultiheadAttention's inference fast path, as TorchNeuron
runs it (its ``python_ops/native_multi_head_attention.py``).

PyTorch takes the fast path on neuron as on CPU and CUDA (an eval-mode, batch_first self-attention
layer with no gradient). TorchNeuron's kernel is a flash-attention pipeline that:
- refuses a mask tensor (an ``attn_mask`` or ``key_padding_mask``) and attention weights
  (``need_weights=True``, the layer's default) with NotImplementedError;
- reads ``mask_type=1`` with no mask as causal attention (PyTorch's kernel ignores a mask type
  without a mask);
- warns when the sequence length is not a multiple of 512 (its flash kernel's tile), and then
  runs its XLA lowering;
- returns an empty tensor for the weights it was not asked for (CPU returns None).

Here the attention is CPU's own kernel on the neuron tensors' bytes (a causal mask made for
``mask_type=1``). The two refusals raise under ``TORCH_NEURONX_EAGER_SEMANTICS=trainium``
(``trainium_semantics.mha_refusal``); by default the call computes what CPU computes and the readiness
report lists it as a place that would fail (``mha-fast-path``).
"""
from __future__ import annotations

import warnings

import torch

from torch_neuronx.python_ops.host_route import run_on_host
from torch_neuronx.runtime import ops

NAME = "_native_multi_head_attention"
FLASH_TILE = 512
_library: torch.library.Library | None = None


def attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask=None,
              need_weights=True, average_attn_weights=True, mask_type=None):
    if embed_dim % num_head != 0:
        raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_head ({num_head}). Choose a number of "
                         "heads that divides the embedding dimension.")
    if query.shape[1] % FLASH_TILE != 0:
        warnings.warn(f"Sequence length {query.shape[1]} is not a multiple of {FLASH_TILE}. Falling back to "
                      "XLA/MLIR implementation instead of flash attention for better compatibility.",
                      UserWarning, stacklevel=3)
    causal = mask is None and mask_type == 1

    def compute(q, k, v, w, b, pw, pb, m):
        if causal:
            m = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).triu(1)
        out, weights = torch.ops.aten._native_multi_head_attention(
            q, k, v, embed_dim, num_head, w, b, pw, pb, m, need_weights, average_attn_weights,
            0 if causal else mask_type)
        return out, weights if weights is not None else torch.empty(0, dtype=q.dtype)

    args = (query, key, value, qkv_weight, qkv_bias, proj_weight, proj_bias, mask)
    results = run_on_host(compute, args)
    ops._track_op(NAME, [a for a in args if a is not None], list(results))
    return results


def attention_out(*args, out0, out1, **kwargs):
    out, weights = attention(*args, **kwargs)
    with torch.no_grad():
        for target, result in ((out0, out), (out1, weights)):
            if target.shape != result.shape:
                target.resize_(result.shape)
            target.copy_(result)
    return out0, out1


def install() -> None:
    """Register the kernel and its ``.out`` overload for neuron (once per process)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl(NAME, attention, "PrivateUse1")
    library.impl(f"{NAME}.out", attention_out, "PrivateUse1")
    _library = library
