"""DTensor sharding strategies for the attention op TorchNeuron runs on neuron.

On neuron, SDPA of 4-D query, key and value runs ``_scaled_dot_product_fused_attention_overrideable``
(TorchNeuron's backend choice; here CPU's flash kernel computes it). PyTorch gives DTensor strategies
for CUDA's attention ops only, so TorchNeuron registers its own for this op and its backward
(``distributed/tensor/register_sharding.py``). These are ours, for the same placements: everything
replicated, the heads sharded (tensor parallelism, Shard(1)), or the batch (Shard(0)); each without a
collective. A mask (``attn_bias``) is sharded as query, key and value are where it spans that
dimension, and replicated where it broadcasts.

Registered when the first neuron process group is made: DTensor needs one, and importing DTensor at
``import torch_neuronx`` would cost every program its import time.
"""
from __future__ import annotations

_installed = False


def _bias_placement(bias_strategy, query_strategy, placement):
    """The placement of a mask beside q/k/v placed ``placement`` (None when there is no mask): the same
    shard where the mask spans that dimension of the query, else replicated (it broadcasts there)."""
    from torch.distributed.tensor import Replicate, Shard

    if bias_strategy is None:
        return None
    if isinstance(placement, Shard):
        bias_shape = bias_strategy.strategies[0].output_spec.shape
        query_shape = query_strategy.strategies[0].output_spec.shape
        dim = placement.dim - len(query_shape) + len(bias_shape)  # masks broadcast from the right
        if dim < 0 or bias_shape[dim] != query_shape[placement.dim]:
            return Replicate()
    return placement


def _forward_strategy(op_schema):
    """Outputs (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset,
    debug_attn_mask), then the inputs (query, key, value, attn_bias)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    bias = op_schema.args_schema[3] if len(op_schema.args_schema) > 3 else None
    strategies = []
    for placement in (Replicate(), Shard(1), Shard(0)):
        row = [placement, placement, None, None, None, None, Replicate(), Replicate(), None,
               placement, placement, placement]
        if bias is not None:
            row.append(_bias_placement(bias, op_schema.args_schema[0], placement))
        strategies.append(row)
    return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, strategies, input_index=9)


def _backward_strategy(op_schema):
    """Outputs (grad_query, grad_key, grad_value, grad_attn_bias), then the tensor inputs: grad_out,
    query, key, value, attn_bias?, out, logsumexp, and the empty philox tensors."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._op_schema import OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    args = op_schema.args_schema
    bias = args[4] if isinstance(args[4], OpStrategy) else None
    extra = sum(isinstance(a, OpStrategy) for a in args[8:])  # cum_seq and philox tensors, when given
    strategies = []
    for placement in (Replicate(), Shard(1), Shard(0)):
        grad_bias = _bias_placement(bias, args[1], placement)
        row = [placement] * 3 + [grad_bias] + [placement] * 4
        if bias is not None:
            row.append(grad_bias)
        row += [placement, placement] + [Replicate()] * extra
        strategies.append(row)
    return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(validate=False), op_schema, strategies,
                                           input_index=4)


def install() -> None:
    """Register the strategies (once per process)."""
    global _installed
    if _installed:
        return
    import torch
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import register_op_strategy

    aten = torch.ops.aten
    register_op_strategy(aten._scaled_dot_product_fused_attention_overrideable.default,
                         schema_info=RuntimeSchemaInfo(4))(_forward_strategy)
    register_op_strategy(aten._scaled_dot_product_fused_attention_overrideable_backward.default)(_backward_strategy)
    _installed = True
