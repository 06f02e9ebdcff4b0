"""Composites TorchNeuron has a kernel for (linear, matmul, clone, stack, one_hot, ...) are tracked
under their own name, as TorchNeuron tracks them, and compute CPU's composite on the same bytes
(csrc/named_ops.cpp, torch_neuronx/python_ops/torchneuron_kernels.py)."""
import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx.python_ops import torchneuron_kernels

N = "neuron"


def test_the_list_is_read_from_torchneurons_kernels_and_holds_only_composites():
    named = torchneuron_kernels.named_composites()
    assert {"linear", "clone", "stack", "one_hot", "ones", "embedding", "convolution"} <= set(named)
    assert "matmul" not in named  # TorchNeuron registers mm, bmm and linear, not matmul
    for name in named:
        assert torchneuron_kernels.has_kernel(f"aten::{name}"), name
        # they reach the neuron kernel that tracks them now
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "PrivateUse1"), name
    # ops with a CPU kernel of their own (mm, add) are not in it: the host path tracks them already
    assert "mm" not in named and "add.Tensor" not in named


@pytest.mark.parametrize("name, call", [
    ("aten::linear", lambda x, w: F.linear(x, w)),
    ("aten::repeat", lambda x, w: x.repeat(2, 1)),
    ("aten::stack", lambda x, w: torch.stack([x, w])),
    ("aten::clone", lambda x, w: x.clone()),
])
def test_a_composite_is_tracked_once_under_its_name_and_equals_cpu(name, call):
    x, w = torch.randn(4, 8), torch.randn(4, 8)
    xn, wn = x.to(N), w.to(N)
    torch_neuronx.clear_op_tracking()
    out = call(xn, wn)
    executed = torch_neuronx.get_executed_ops()
    assert executed == [name], executed  # not its parts (mm, t, cat, copy_, ...)
    assert torch.equal(out.cpu(), call(x, w))


def test_gradients_through_a_named_composite_equal_cpu():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    grads = []
    for device in ("cpu", N):
        xd, wd = x.to(device).detach().requires_grad_(), w.to(device).detach().requires_grad_()
        F.linear(xd, wd).pow(2).sum().backward()
        grads.append((xd.grad.cpu(), wd.grad.cpu()))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_one_hot_and_ones_are_named_and_their_values_are_cpus():
    labels = torch.tensor([0, 2, 1])
    on_neuron = labels.to(N)
    torch_neuronx.clear_op_tracking()
    hot = F.one_hot(on_neuron, 3)
    ones = torch.ones(2, 3, device=N)
    assert {"aten::one_hot", "aten::ones"} <= set(torch_neuronx.get_executed_ops())
    assert torch.equal(hot.cpu(), F.one_hot(labels, 3)) and torch.equal(ones.cpu(), torch.ones(2, 3))
