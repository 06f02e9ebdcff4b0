"""torch.autocast("neuron") follows CPU's autocast policy: same dtypes, same numbers."""
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
            ln = F.layer_norm(mm, (8,))
            plain = x.to(dev) + 1  # not on any list: unchanged
        results[dev] = (mm, c, low, fp32, ln, plain)
    for n, c in zip(results[N], results["cpu"]):
        assert n.dtype == c.dtype, (n.dtype, c.dtype)
        assert n.device.type == "neuron"
        torch.testing.assert_close(n.cpu(), c, rtol=0, atol=0)
    assert results[N][0].dtype == dtype
    assert results[N][3].dtype == torch.float32


def test_autocast_state_and_default_dtype():
    assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    with torch.autocast("neuron"):
        assert torch.is_autocast_enabled("neuron")
        y = torch.mm(torch.randn(2, 2, device=N), torch.randn(2, 2, device=N))
    assert y.dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron", enabled=False):
        assert torch.mm(torch.randn(2, 2, device=N), torch.randn(2, 2, device=N)).dtype == torch.float32


def test_autocast_backward():
    lin = torch.nn.Linear(4, 4).to(N)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        loss = lin(torch.randn(2, 4, device=N)).float().sum()
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32 and lin.weight.grad.device.type == "neuron"
