"""torch.autocast("neuron") follows TorchNeuron's policy, which is CUDA's lists (its
csrc/amp/autocast_mode.cpp): where those agree with CPU's, the same dtypes and numbers as CPU;
where they differ, CUDA's dtypes; binary_cross_entropy refused; float16 by default."""
import pytest
import torch
import torch.nn.functional as F

N = "neuron"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_matches_cpu(dtype):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    conv = torch.nn.Conv2d(2, 2, 3)
    x, img = torch.randn(4, 8), torch.randn(1, 2, 6, 6)
    results = {}
    for dev in ("cpu", N):
        lin.to(dev), conv.to(dev)
        with torch.autocast(dev, dtype=dtype):
            mm = lin(x.to(dev))
            c = conv(img.to(dev))
            low = torch.mm(x.to(dev), x.to(dev).T)
            fp32 = F.mse_loss(mm, torch.zeros_like(mm))
            plain = x.to(dev) + 1  # not on any list: unchanged
        results[dev] = (mm, c, low, fp32, plain)
    for n, c in zip(results[N], results["cpu"]):
        assert n.dtype == c.dtype, (n.dtype, c.dtype)
        assert n.device.type == "neuron"
        torch.testing.assert_close(n.cpu(), c, rtol=0, atol=0)
    assert results[N][0].dtype == dtype
    assert results[N][3].dtype == torch.float32


def test_autocast_state_and_default_dtype():
    assert torch.get_autocast_dtype("neuron") == torch.float16  # PyTorch's for PrivateUse1, kept by TorchNeuron
    with torch.autocast("neuron"):
        assert torch.is_autocast_enabled("neuron")
        y = torch.mm(torch.randn(2, 2, device=N), torch.randn(2, 2, device=N))
    assert y.dtype == torch.float16
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron", enabled=False):
        assert torch.mm(torch.randn(2, 2, device=N), torch.randn(2, 2, device=N)).dtype == torch.float32


def test_autocast_backward():
    lin = torch.nn.Linear(4, 4).to(N)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        loss = lin(torch.randn(2, 4, device=N)).float().sum()
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32 and lin.weight.grad.device.type == "neuron"


# Ops whose policy is CUDA's and not CPU's: what TorchNeuron's tests/autocast check, by list.
CUDA_FP32 = {"acos": lambda x: torch.acos(x.clamp(-0.5, 0.5)), "pow": lambda x: torch.pow(x, 2.0),
             "softplus": F.softplus, "exp": torch.exp, "log_softmax": lambda x: F.log_softmax(x, -1),
             "sum": torch.sum, "norm": torch.norm, "layer_norm": lambda x: F.layer_norm(x, (4,))}


@pytest.mark.parametrize("op", sorted(CUDA_FP32))
def test_cudas_fp32_list_runs_in_float32(op):
    x = torch.rand(4, 4, device=N).half()
    with torch.autocast("neuron", dtype=torch.float16):
        out = CUDA_FP32[op](x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), CUDA_FP32[op](x.cpu().float()), rtol=0, atol=0)


def test_cudas_promote_list_and_the_banned_binary_cross_entropy():
    half, full = torch.rand(3, device=N).half(), torch.rand(3, device=N)
    with torch.autocast("neuron", dtype=torch.float16):
        assert torch.addcmul(half, full, half).dtype == torch.float32  # promoted, not failing
        assert torch.cat([half, full]).dtype == torch.float32
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(full.sigmoid(), full)
        assert F.binary_cross_entropy_with_logits(half, full).dtype == torch.float32
    assert F.binary_cross_entropy(full.sigmoid(), full).device.type == "neuron"  # outside autocast: allowed
