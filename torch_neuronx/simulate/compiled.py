"""Compiled graphs in the simulator: ``torch.compile(backend="neuron")`` on fake tensors.

Nothing can be compiled for the host from fake tensors, and nothing needs to be: the plan needs
what each graph call does on Trainium, one fused NEFF. So while a rank runs, the backend hands
each Dynamo graph here (:data:`torch_neuronx.runtime.hooks.graph_simulator`). AOTAutograd splits
it as TorchNeuron's compiler would (a forward and, when it trains, a backward graph), and each
part runs its aten ops on the fake tensors inside :meth:`RankRecorder.graph_call`, which costs
them as one fused NEFF and counts one launch per call.

Attention follows TorchNeuron's compiler: its decomposition of SDPA calls the NKI flash-attention
kernel when the shapes allow (forward: query length a multiple of 128, key length of 512, head
dimension at most 128, no mask, no dropout; backward: both lengths multiples of 512), and the
plain decomposition otherwise (scores and probabilities as tensors, saved for the backward when
it trains). Such calls become one op here, :func:`nki_flash_attention`, whose backward saves only
the query, key, value, output and log-sum-exp, as the kernel's does (torch_neuronx's
``neuron_dynamo_backend/decompositions.py``, ``sdpa_fused_overrideable``).
"""
from __future__ import annotations

import contextlib

import torch

from torch_neuronx.runtime import hooks
from torch_neuronx.simulate import steps


def _part(name: str, kind: str):
    """AOTAutograd's compiler of one part (forward, backward, inference): run its graph as it is."""
    def compile_part(fx_graph, _example_inputs):
        label = name if kind != "backward" else f"{name}.backward"

        def run(args):
            active = steps.recording
            with active.graph_call(label, args) if active is not None else contextlib.nullcontext() as call:
                outputs = fx_graph(*args)
                if call is not None:
                    call.outputs = outputs
            return outputs

        run._boxed_call = True  # AOTAutograd passes the arguments as one list
        return run

    return compile_part


# ---- the NKI flash-attention kernel, as one op -------------------------------------------------
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


def _attention_as_on_neuron(gm) -> None:
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


def simulate_graph(gm, example_inputs, name: str):
    """What the backend returns for a Dynamo graph while a rank is simulated."""
    from torch._dynamo.backends.common import aot_autograd

    _attention_as_on_neuron(gm)
    backend = aot_autograd(fw_compiler=_part(name, "forward"), bw_compiler=_part(name, "backward"),
                           inference_compiler=_part(name, "inference"), keep_inference_input_mutations=True)
    return backend(gm, example_inputs)


@contextlib.contextmanager
def installed():
    """The backend simulates its graphs for the duration."""
    previous = hooks.graph_simulator
    hooks.install_graph_simulator(simulate_graph)
    try:
        yield
    finally:
        hooks.install_graph_simulator(previous)
