"""Run under torchrun (2 processes): DTensors on neuron run TorchNeuron's fused ops, which DTensor
shards. SDPA runs _scaled_dot_product_fused_attention_overrideable, sharded by the heads, the batch, or
not at all, with no collective, forward and backward; the values and gradients are CPU's (the oracle),
bit for bit, eager and compiled. rms_norm runs _fused_rms_norm and _fused_rms_norm_backward, sharded by
the batch, the sequence or not at all; its values and input gradients are CPU's bit for bit, its
weight gradient (summed across ranks) CPU's within rounding. Each rank writes "<rank> ok" to
RESULT_DIR. Used by tests/test_attention.py and tests/test_rms_norm.py."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import torch_neuronx

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = DeviceMesh("neuron", list(range(world)))
torch.manual_seed(0)
for placement in (Shard(1), Shard(0), Replicate()):
    for mask in (None, torch.randn(4, 1, 8, 8)):
        q, k, v = (torch.randn(4, 6, 8, 8, requires_grad=True) for _ in range(3))
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        expected.sum().backward()
        leaves = [distribute_tensor(t.detach().to("neuron"), mesh, [placement]).requires_grad_() for t in (q, k, v)]
        bias = None if mask is None else distribute_tensor(
            mask.to("neuron"), mesh, [placement if isinstance(placement, Shard) and placement.dim == 0 else Replicate()])
        comms = CommDebugMode()
        torch_neuronx.clear_op_tracking()
        with comms:
            out = F.scaled_dot_product_attention(*leaves, attn_mask=bias, is_causal=mask is None)
            out.sum().backward()
        executed = torch_neuronx.get_executed_ops()
        assert "aten::_scaled_dot_product_fused_attention_overrideable" in executed, executed
        assert "aten::_scaled_dot_product_fused_attention_overrideable_backward" in executed, executed
        assert comms.get_total_counts() == 0, (placement, comms.get_comm_counts())
        assert out.placements == (placement,), (placement, out.placements)
        assert torch.equal(out.full_tensor().cpu(), expected.detach()), placement
        for leaf, cpu in zip(leaves, (q, k, v)):
            assert leaf.grad.placements == (placement,)
            assert torch.equal(leaf.grad.full_tensor().cpu(), cpu.grad), placement

# Compiled: the graph traced from DTensors holds the fused op, which runs on the host's aliases.
q, k, v = (torch.randn(4, 6, 8, 8) for _ in range(3))
attention = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), backend="neuron")
out = attention(*(distribute_tensor(t.to("neuron"), mesh, [Shard(1)]) for t in (q, k, v)))
assert out.placements == (Shard(1),)
assert torch.equal(out.full_tensor().cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))

for placement in (Shard(0), Shard(1), Replicate()):
    x, w = torch.randn(4, 6, 16, requires_grad=True), torch.randn(16, requires_grad=True)
    expected = F.rms_norm(x, (16,), w, 1e-6)
    expected.sum().backward()
    dx = distribute_tensor(x.detach().to("neuron"), mesh, [placement]).requires_grad_()
    dw = distribute_tensor(w.detach().to("neuron"), mesh, [Replicate()]).requires_grad_()
    torch_neuronx.clear_op_tracking()
    out = F.rms_norm(dx, (16,), dw, 1e-6)
    assert "aten::_fused_rms_norm" in torch_neuronx.get_executed_ops(), torch_neuronx.get_executed_ops()
    torch_neuronx.clear_op_tracking()
    out.sum().backward()
    assert "aten::_fused_rms_norm_backward" in torch_neuronx.get_executed_ops(), torch_neuronx.get_executed_ops()
    assert out.placements == (placement,) and dx.grad.placements == (placement,), (placement, out.placements)
    assert torch.equal(out.full_tensor().cpu(), expected.detach()), placement
    assert torch.equal(dx.grad.full_tensor().cpu(), x.grad), placement
    torch.testing.assert_close(dw.grad.full_tensor().cpu(), w.grad)

# Compiled: a graph traced from DTensors holds the composite, as Inductor on CPU traces it.
norm = torch.compile(lambda a, b: F.rms_norm(a, (16,), b, 1e-6), backend="neuron")
x, w = torch.randn(4, 6, 16), torch.randn(16)
out = norm(distribute_tensor(x.to("neuron"), mesh, [Shard(0)]), distribute_tensor(w.to("neuron"), mesh, [Replicate()]))
torch.testing.assert_close(out.full_tensor().cpu(), F.rms_norm(x, (16,), w, 1e-6))

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:
    f.write(f"{rank} ok")
dist.destroy_process_group()
