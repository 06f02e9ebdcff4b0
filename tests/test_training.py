"""Training on neuron gives CPU's gradients and weights, step for step."""
import copy

import pytest
import torch

from helpers.oracle import assert_same

N = "neuron"


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 32), torch.nn.SiLU(), torch.nn.Linear(32, 4))


def conv_net():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 4))


@pytest.mark.parametrize("make_model,input_shape", [(mlp, (8, 16)), (conv_net, (4, 3, 12, 12))],
                         ids=["mlp", "conv_net"])
@pytest.mark.parametrize("foreach", [False, True])
def test_three_adamw_steps_match_cpu(make_model, input_shape, foreach):
    torch.manual_seed(0)
    model_cpu = make_model()
    model = copy.deepcopy(model_cpu).to(N)
    opt_cpu = torch.optim.AdamW(model_cpu.parameters(), lr=1e-2, foreach=foreach)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)
    for step in range(3):
        x = torch.randn(*input_shape)
        target = torch.randint(0, 4, (input_shape[0],))
        for m, o, dev in ((model_cpu, opt_cpu, "cpu"), (model, opt, N)):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x.to(dev)), target.to(dev))
            loss.backward()
            o.step()
        for (name, p_cpu), p in zip(model_cpu.named_parameters(), model.parameters()):
            assert p.device.type == "neuron"
            assert_same(p.grad, p_cpu.grad, exact=False, rtol=1e-5, atol=1e-6)
            assert_same(p, p_cpu, exact=False, rtol=1e-5, atol=1e-6)
    for b, b_cpu in zip(model.buffers(), model_cpu.buffers()):
        assert_same(b, b_cpu, exact=False, rtol=1e-5, atol=1e-6)
    for state, state_cpu in zip(opt.state.values(), opt_cpu.state.values()):
        assert_same(state["exp_avg"], state_cpu["exp_avg"], exact=False, rtol=1e-5, atol=1e-7)


def test_module_methods_and_grad_mode():
    model = mlp().neuron()
    assert all(p.is_neuron for p in model.parameters())
    with torch.no_grad():
        y = model(torch.randn(2, 16, device=N))
    assert not y.requires_grad
    model.cpu()
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_backward_on_neuron_uses_the_current_intraop_thread_count():
    # Any thread that runs neuron ops (the caller's, or autograd's neuron device thread when a
    # backward is started from C++) must follow torch.set_num_threads (else results and speed differ).
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            grad = grad * 1  # a neuron op on this thread
            seen.append(torch.get_num_threads())
            return grad

    before = torch.get_num_threads()
    try:
        for count in (2, 1, 2):
            torch.set_num_threads(count)
            Probe.apply(torch.ones(4, device=N, requires_grad=True)).sum().backward()
        assert seen == [2, 1, 2]
    finally:
        torch.set_num_threads(before)
