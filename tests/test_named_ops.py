"""Composites TorchNeuron has a kernel for (linear, clone, stack, one_hot, ...) are tracked
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
    # not its parts (mm, t, cat, copy_, ...); its result's allocation, as TorchNeuron lists it
    assert executed == sorted([name, "aten::empty_strided"]), executed
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


def test_allocations_and_resizes_are_tracked_as_torchneuron_tracks_them():
    # its test_resize / test_empty_strided / test_empty_memory_format assert these names
    torch_neuronx.clear_op_tracking()
    x = torch.empty(2, 3, device=N)
    torch.empty_strided((2, 3), (1, 2), device=N)
    x.resize_(4, 5)
    assert {"aten::empty.memory_format", "aten::empty_strided", "aten::resize_"} <= \
        set(torch_neuronx.get_executed_ops())
    assert x.shape == (4, 5) and x.device.type == "neuron"


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, False)])
def test_linear_backward_is_torchneurons_kernel_and_equals_cpus_gradients(mask):
    # PyTorch has aten::linear_backward for MKLDNN only; TorchNeuron's tests call it on neuron tensors
    x, w, b = torch.randn(2, 5, 4), torch.randn(3, 4), torch.randn(3)
    grad = torch.randn(2, 5, 3)
    xc, wc, bc = (t.clone().requires_grad_() for t in (x, w, b))
    F.linear(xc, wc, bc).backward(grad)
    torch_neuronx.clear_op_tracking()
    gx, gw, gb = torch.ops.aten.linear_backward(x.to(N), grad.to(N), w.to(N), list(mask))
    assert "aten::linear_backward" in torch_neuronx.get_executed_ops()
    assert (gx is None) == (not mask[0]) and (gw is None) == (gb is None) == (not (mask[1] or mask[2]))
    for ours, cpu in ((gx, xc.grad), (gw, wc.grad), (gb, bc.grad)):
        if ours is not None:
            assert ours.device.type == "neuron"
            torch.testing.assert_close(ours.cpu(), cpu)


def test_sync_batch_norms_kernels_are_tracked_under_their_names():
    x = torch.randn(4, 3, 5)
    torch_neuronx.clear_op_tracking()
    mean, invstd = torch.batch_norm_stats(x.to(N), 1e-5)
    assert "aten::batch_norm_stats" in torch_neuronx.get_executed_ops()
    torch.testing.assert_close(mean.cpu(), x.mean((0, 2)))


def test_overloads_only_torchneurons_jax_registry_has_decompose_as_in_its_torch_mlir_one():
    # its test_where asserts where.self for a scalar branch; its repeat_interleave kernels are commented out
    x = torch.randn(3)
    xn = x.to(N)
    torch_neuronx.clear_op_tracking()
    out = torch.where(xn > 0, 1.0, xn)
    assert "aten::where.self" in torch_neuronx.get_executed_ops()
    assert not any("ScalarSelf" in op for op in torch_neuronx.get_executed_ops())
    assert torch.equal(out.cpu(), torch.where(x > 0, 1.0, x))
    assert "repeat_interleave.self_int" not in torchneuron_kernels.named_composites()


def test_data_assignment_across_devices_is_tracked_as_torchneurons_kernel():
    """tests/operations/test_has_compatible_shallow_copy_type.py: TorchNeuron's kernel answers for a
    neuron argument, and is tracked; between CPU tensors it is CPU's business."""
    x = torch.randn(10, 5)
    y = x.to("neuron")
    torch_neuronx.clear_op_tracking()
    a, b = torch.randn(2), torch.randn(2)
    a.data = b
    assert torch_neuronx.get_executed_ops() == []
    x.data = y
    assert torch_neuronx.get_executed_ops() == ["aten::_has_compatible_shallow_copy_type"]
    assert x.device.type == "neuron" and torch.equal(x.cpu(), y.cpu())


@pytest.mark.parametrize("selected", [0, 1, 3])
def test_a_boolean_index_is_tracked_as_torchneurons_nonzero_and_index(selected):
    """TorchNeuron's index turns a boolean mask into indices with its nonzero kernel, and a mask that
    selects nothing never reaches its index kernel (its test_index.py); the values stay CPU's."""
    x = torch.randn(3, 4)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask.view(-1)[:selected] = True
    xn, mn = x.to(N), mask.to(N)
    torch_neuronx.clear_op_tracking()
    got = xn[mn]
    executed = torch_neuronx.get_executed_ops()
    assert torch.equal(got.cpu(), x[mask])
    assert "aten::nonzero" in executed
    assert ("aten::index.Tensor" in executed) == (selected > 0), executed
    torch_neuronx.clear_op_tracking()
    assert torch.equal(xn[mn[:, 0], 1:].cpu(), x[mask[:, 0], 1:])  # a mask of one dimension, beside a slice
    rows = torch.tensor([0, 2], device=N)
    torch_neuronx.clear_op_tracking()
    xn[rows]  # integer indices: no nonzero
    assert torch_neuronx.get_executed_ops() == ["aten::empty_strided", "aten::index.Tensor"]


@pytest.mark.parametrize("call, tracked, untracked", [
    (lambda x: x.tril_(), "aten::tril.out", "aten::tril_"),
    (lambda x: x.triu_(1), "aten::triu.out", "aten::triu_"),
    (lambda x: x.abs_().sqrt_(), "aten::sqrt.out", "aten::sqrt_"),
    (lambda x: x.clamp_(min=0.0), "aten::clamp.out", "aten::clamp_"),
    (lambda x: x.pow_(2.0), "aten::pow.Tensor_Scalar_out", "aten::pow_.Scalar"),
])
def test_an_inplace_op_torchneuron_lacks_is_tracked_as_its_out_kernel(call, tracked, untracked):
    """TorchNeuron registers tril.out but no tril_: PyTorch's generic in-place kernel calls the .out one,
    which its op tracking lists (its test_tril.py); ops it has an in-place kernel for keep their name."""
    x = torch.randn(4, 4)
    xn = x.to(N)
    torch_neuronx.clear_op_tracking()
    call(xn)
    executed = torch_neuronx.get_executed_ops()
    assert tracked in executed and untracked not in executed, executed
    assert torch.equal(xn.cpu(), call(x))
    torch_neuronx.clear_op_tracking()
    xn.add_(1.0).mul_(2.0)  # TorchNeuron has add_ and mul_ kernels
    assert torch_neuronx.get_executed_ops() == ["aten::add_.Tensor", "aten::mul_.Tensor"]


def test_a_copy_across_devices_or_of_float64_bool_int32_is_tracked_with_its_copy_():
    """TorchNeuron's torch-mlir _to_copy takes neuron -> neuron copies of other dtypes; the rest run
    PyTorch's native _to_copy, an empty then copy_, and its op tracking lists copy_ (its test_to_copy.py)."""
    x = torch.randn(4)
    cases = [(lambda: x.to(N), True), (lambda: xn.cpu(), True), (lambda: xn.to(torch.bfloat16), False),
             (lambda: xn.double(), True), (lambda: xn.to(torch.int32), True), (lambda: xn.half(), False)]
    xn = x.to(N)
    for call, with_copy in cases:
        torch_neuronx.clear_op_tracking()
        call()
        executed = torch_neuronx.get_executed_ops()
        assert "aten::_to_copy" in executed and ("aten::copy_" in executed) == with_copy, executed
