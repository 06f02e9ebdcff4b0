"""SDPA on neuron takes TorchNeuron's backend choice: the fused overrideable op for 4-D query, key and
value (csrc/native_kernels.cpp, fused_sdp_choice), computed by CPU's flash kernel, so values and
gradients stay CPU's bit for bit; DTensor shards it (torch_neuronx/distributed/sharding.py)."""
import os

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

from helpers import isolated

HERE = os.path.dirname(__file__)
N = "neuron"
FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"


@pytest.mark.parametrize("mask, causal", [(None, False), (None, True), ("bool", False), ("float", False)])
def test_4d_attention_runs_torchneurons_fused_op_with_cpus_values_and_gradients(mask, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    m = {None: None, "bool": torch.rand(16, 16) > 0.3, "float": torch.randn(2, 1, 16, 16)}[mask]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)
    expected.sum().backward()
    leaves = [t.detach().to(N).requires_grad_() for t in (q, k, v)]
    torch_neuronx.clear_op_tracking()
    out = F.scaled_dot_product_attention(*leaves, attn_mask=None if m is None else m.to(N), is_causal=causal)
    out.sum().backward()
    executed = torch_neuronx.get_executed_ops()
    assert FUSED in executed and f"{FUSED}_backward" in executed, executed
    assert not any("flash_attention_for_cpu" in name for name in executed), executed
    assert torch.equal(out.detach().cpu(), expected.detach())
    for leaf, cpu in zip(leaves, (q, k, v)):
        assert torch.equal(leaf.grad.cpu(), cpu.grad)


def test_where_cpu_would_not_run_its_flash_kernel_neuron_runs_cpus_route():
    """3-D inputs and dropout take CPU's math route on CPU: the same here, not the fused op."""
    x = torch.randn(4, 16, 8)
    xn = x.to(N)
    torch_neuronx.clear_op_tracking()
    out = F.scaled_dot_product_attention(xn, xn, xn)
    assert FUSED not in torch_neuronx.get_executed_ops()
    assert torch.equal(out.cpu(), F.scaled_dot_product_attention(x, x, x))
    torch_neuronx.clear_op_tracking()
    F.scaled_dot_product_attention(xn[None], xn[None], xn[None], dropout_p=0.5)
    assert FUSED not in torch_neuronx.get_executed_ops()


@pytest.mark.long  # two torchrun ranks: make test-long (CI runs it; make test stays under 10 minutes)
def test_dtensor_shards_torchneurons_fused_ops_with_cpus_values(tmp_path):
    """Attention here, rms_norm too (one torchrun for both; see tests/test_rms_norm.py)."""
    r = isolated.torchrun(os.path.join(HERE, "distributed", "dtensor_fused_ops.py"), 2, RESULT_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr[-4000:]
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == ["0 ok", "1 ok"]
