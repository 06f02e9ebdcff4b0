"""rms_norm runs as TorchNeuron runs it (csrc/rms_norm.cpp): one _fused_rms_norm call forward (a half
input beside a weight of another dtype first goes to float32) and one _fused_rms_norm_backward call
backward, with CPU's values and gradients bit for bit; a traced graph holds CPU's composite. DTensors:
tests/distributed/dtensor_fused_ops.py (run by tests/test_attention.py)."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx.diagnostics import observer

N = "neuron"
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
          (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float32, torch.bfloat16),
          (torch.float64, torch.float64), (torch.bfloat16, torch.float16), (torch.float32, None),
          (torch.bfloat16, None)]
SHAPES = [((4, 8), (8,)), ((2, 3, 16), (16,)), ((2, 3, 5, 6), (5, 6))]
GRADS = [(True, True), (True, False), (False, True)]


def _run(device, x, w, normalized, eps, grads, g):
    xx = x.detach().clone().to(device).requires_grad_(grads[0])
    ww = None if w is None else w.detach().clone().to(device).requires_grad_(grads[1])
    y = F.rms_norm(xx, normalized, ww, eps)
    y.backward(g.to(device).to(y.dtype))
    return y.detach(), xx.grad, None if ww is None else ww.grad


def _same(neuron, cpu):
    if neuron is None or cpu is None:
        return neuron is None and cpu is None
    return neuron.dtype == cpu.dtype and neuron.stride() == cpu.stride() and torch.equal(neuron.cpu(), cpu)


@pytest.mark.parametrize("observed", [False, True], ids=["counted", "observed"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: "-".join(str(t).split(".")[-1] for t in d))
def test_values_and_gradients_are_cpus_bit_for_bit(dtypes, observed):
    """Every dtype pair, shape, gradient mask, eps and layout; also while diagnostics observe the parts."""
    if observed:
        observer.start()
    try:
        for (shape, normalized), grads, eps, strided in itertools.product(SHAPES, GRADS, [1e-5, None],
                                                                          [False, True]):
            if dtypes[1] is None and not grads[0]:
                continue
            torch.manual_seed(0)
            x = torch.randn(shape).to(dtypes[0])
            if strided:
                x = x.transpose(0, -1).contiguous().transpose(0, -1)
            w = None if dtypes[1] is None else torch.randn(normalized).to(dtypes[1])
            g = torch.randn(shape)
            cpu = _run("cpu", x, w, normalized, eps, grads, g)
            neuron = _run(N, x, w, normalized, eps, grads, g)
            case = (shape, grads, eps, strided)
            assert _same(neuron[0], cpu[0]), ("output", case)
            assert _same(neuron[1], cpu[1]) or (strided and torch.equal(neuron[1].cpu(), cpu[1])), ("input grad", case)
            assert _same(neuron[2], cpu[2]), ("weight grad", case)
    finally:
        if observed:
            observer.stop()


@pytest.mark.parametrize("dtypes, casts", [((torch.float32, torch.float32), False),
                                           ((torch.bfloat16, torch.float32), True),
                                           ((torch.bfloat16, torch.bfloat16), False)])
def test_one_fused_call_each_way_under_torchneurons_names(dtypes, casts):
    x = torch.randn(4, 8, dtype=dtypes[0], device=N, requires_grad=True)
    w = torch.randn(8, dtype=dtypes[1], device=N, requires_grad=True)
    torch_neuronx.clear_op_tracking()
    y = F.rms_norm(x, (8,), w, 1e-5)
    forward = torch_neuronx.get_executed_ops()
    assert "aten::_fused_rms_norm" in forward, forward
    assert ("aten::_to_copy" in forward) == casts, forward  # TorchNeuron's float32 detour, and back
    assert not {"aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::rsqrt"} & set(forward), forward
    torch_neuronx.clear_op_tracking()
    y.sum().backward()
    backward = torch_neuronx.get_executed_ops()
    assert "aten::_fused_rms_norm_backward" in backward, backward
    assert "aten::pow.Tensor_Scalar" not in backward, backward


def test_without_grad_and_with_a_second_derivative():
    torch.manual_seed(0)
    x, w = torch.randn(3, 16), torch.randn(16)
    with torch.no_grad():
        assert torch.equal(F.rms_norm(x.to(N), (16,), w.to(N)).cpu(), F.rms_norm(x, (16,), w))
    grads = []
    for device in ("cpu", N):
        xx = x.clone().to(device).requires_grad_()
        (gx,) = torch.autograd.grad(F.rms_norm(xx, (16,), w.to(device)).pow(2).sum(), xx, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.sum(), xx)
        grads.append((gx.detach().cpu(), ggx.cpu()))
    torch.testing.assert_close(grads[1], grads[0])


def test_compiled_graph_holds_cpus_composite_and_equals_inductor_on_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.RMSNorm(32, eps=1e-6))
    x = torch.randn(8, 32)
    results = []
    for device, backend in (("cpu", "inductor"), (N, "neuron")):
        m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.RMSNorm(32, eps=1e-6)).to(device)
        m.load_state_dict(model.state_dict())
        xx = x.clone().to(device).requires_grad_()
        y = torch.compile(m, backend=backend, fullgraph=True)(xx)
        y.sum().backward()
        results.append([t.detach().cpu() for t in (y, xx.grad, m[1].weight.grad)])
    for neuron, cpu in zip(results[1], results[0]):
        assert torch.equal(neuron, cpu)


def test_direct_calls_of_the_fused_ops():
    """_fused_rms_norm_backward, which CPU lacks, from the outputs of _fused_rms_norm."""
    torch.manual_seed(0)
    x, w, g = torch.randn(4, 8), torch.randn(8), torch.randn(4, 8)
    out, rstd = torch.ops.aten._fused_rms_norm(x.to(N), [8], w.to(N), 1e-5)
    cpu_out, cpu_rstd = torch.ops.aten._fused_rms_norm(x, [8], w, 1e-5)
    assert torch.equal(out.cpu(), cpu_out) and torch.equal(rstd.cpu(), cpu_rstd)
    gx, gw = torch.ops.aten._fused_rms_norm_backward(g.to(N), x.to(N), [8], rstd, w.to(N), [True, True])
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.rms_norm(xx, (8,), ww, 1e-5).backward(g)
    assert torch.equal(gx.cpu(), xx.grad) and torch.equal(gw.cpu(), ww.grad)
    gx, gw = torch.ops.aten._fused_rms_norm_backward(g.to(N), x.to(N), [8], rstd, w.to(N), [False, True])
    assert gx is None and torch.equal(gw.cpu(), ww.grad)
