"""Compiled optimizer steps, compiled train steps and tensors Dynamo installs as graph attributes
(optimizer state, buffers, free tensors): the neuron backend equals Inductor on CPU running the
same code, bit for bit, and in-place updates land in the neuron tensors."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from torch_neuronx import neuron_dynamo_backend as backend
from torch_neuronx.neuron_dynamo_backend import host_graph


pytestmark = pytest.mark.usefixtures("fresh_compile")


def compiled_on(device, fn):
    """``fn`` compiled for ``device`` (Inductor on CPU: the oracle). Dynamo is reset first: both
    runs compile the same optimizer code, and Dynamo's recompile limit must not send one to eager."""
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(fn, backend="inductor" if device == "cpu" else "neuron")


def assert_compiled(device):
    """Something really compiled (nothing fell back to eager)."""
    if device == "cpu":
        assert counters["stats"]["unique_graphs"] > 0
    else:
        metrics = backend.get_dynamo_metrics()
        assert metrics and not any(m["fell_back"] for m in metrics)


def assert_equal_tensors(neuron_values, cpu_values):
    assert len(neuron_values) == len(cpu_values)
    for n, c in zip(neuron_values, cpu_values):
        assert n.device.type == "neuron"
        assert torch.equal(n.detach().cpu(), c.detach()), (n, c)


OPTIMIZERS = {
    "sgd-momentum": lambda params, device: torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False),
    "sgd-momentum-foreach": lambda params, device: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True,
                                                                   weight_decay=0.01, foreach=True),
    "adam-lr-tensor": lambda params, device: torch.optim.Adam(params, lr=torch.tensor(0.01), foreach=False),
    "adamw-capturable-foreach-lr-tensor": lambda params, device: torch.optim.AdamW(
        params, lr=torch.tensor(0.01, device=device), capturable=True, foreach=True),
}


def optimizer_steps(device, make_optimizer, steps=3, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    grads = [[torch.randn(p.shape) for p in model.parameters()] for _ in range(steps)]
    model.to(device)
    opt = make_optimizer(list(model.parameters()), device)
    step = compiled_on(device, opt.step)
    versions = [p._version for p in model.parameters()]
    for grads_now in grads:
        for p, g in zip(model.parameters(), grads_now):
            p.grad = g.to(device)
        step()
    assert_compiled(device)
    assert all(p._version > v for p, v in zip(model.parameters(), versions))  # autograd sees the update
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return list(model.parameters()), state


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_compiled_optimizer_step_equals_inductor_on_cpu(name):
    params_cpu, state_cpu = optimizer_steps("cpu", OPTIMIZERS[name])
    params, state = optimizer_steps("neuron", OPTIMIZERS[name])
    assert_equal_tensors(params, params_cpu)
    # the state keeps its values and its place (on neuron; a non-capturable step count on CPU)
    assert len(state) == len(state_cpu) and state
    for n, c in zip(state, state_cpu):
        assert n.device.type == "neuron" or n.dim() == 0
        assert torch.equal(n.cpu(), c)


def test_cached_optimizer_graph_reads_the_current_state_not_the_compiled_one():
    """The second run loads every graph from the compile cache: the state tensors are graph
    inputs, so their values (different here) are no part of the cached code."""
    optimizer_steps("neuron", OPTIMIZERS["sgd-momentum"], seed=0)
    backend.reset_dynamo_metrics()
    params, _ = optimizer_steps("neuron", OPTIMIZERS["sgd-momentum"], seed=1)
    assert all(m["cache"] == "hit" for m in backend.get_dynamo_metrics())
    params_cpu, _ = optimizer_steps("cpu", OPTIMIZERS["sgd-momentum"], seed=1)
    assert_equal_tensors(params, params_cpu)


@pytest.mark.parametrize("name", ["sgd-momentum", "adamw-capturable-foreach-lr-tensor"])
def test_compiled_train_step_with_backward_and_optimizer_step_equals_inductor_on_cpu(name):
    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        data = [(torch.randn(5, 4), torch.randn(5, 2)) for _ in range(3)]
        model.to(device)
        opt = OPTIMIZERS[name](list(model.parameters()), device)

        def train_step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # a graph break: autograd runs the compiled backward eagerly
            opt.step()
            return loss.detach()

        step = compiled_on(device, train_step)
        losses = [step(x.to(device), y.to(device)) for x, y in data]
        assert_compiled(device)
        return losses + list(model.parameters())

    assert_equal_tensors(run("neuron"), run("cpu"))


class WithTensorAttributes(torch.nn.Module):
    """A plain tensor attribute, a non-persistent constant buffer and a buffer mutated in forward."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.table = torch.randn(4)
        self.register_buffer("offset", torch.randn(4), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return self.linear(x) * self.table + self.offset

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.table = fn(self.table)
        return self


def test_buffers_attributes_and_closures_installed_as_graph_attributes_equal_inductor_on_cpu(monkeypatch):
    """install_free_tensors makes Dynamo install module tensors and closed-over tensors as graph
    attributes (real neuron tensors) rather than inputs (as by default, which test_compile.py
    covers); the results are Inductor's, and in-place changes between calls are seen."""
    lifted = []
    lift = host_graph.lift_tensor_attributes

    def recording_lift(*args):
        tensors = lift(*args)
        lifted.extend(tensors)
        return tensors

    monkeypatch.setattr(host_graph, "lift_tensor_attributes", recording_lift)
    def run(device):
        torch.manual_seed(0)
        bn_model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 1))
        attr_model = WithTensorAttributes()
        weight, total = torch.randn(4, 4), torch.zeros(4)
        xs = [torch.randn(8, 4) for _ in range(2)]
        bn_model.to(device).train()
        attr_model.to(device)
        weight, total = weight.to(device), total.to(device)

        def closure(x):
            total.add_(x.sum(0))  # mutates a closed-over tensor
            return torch.tanh(x @ weight) + total

        bn, attr, fn = (compiled_on(device, f) for f in (bn_model, attr_model, closure))
        outputs = []
        for x in xs:
            x = x.to(device)
            out = bn(x)
            out.sum().backward()
            outputs += [out, attr(x), fn(x)]
            with torch.no_grad():  # in place between calls: the compiled code must read the new values
                attr_model.table.mul_(2)
                attr_model.offset.add_(1)
                weight.mul_(0.5)
        assert_compiled(device)
        stats = bn_model[1]
        return outputs + [stats.running_mean, stats.running_var, stats.num_batches_tracked, attr_model.calls,
                          total] + [p.grad for p in bn_model.parameters()]

    with torch._dynamo.config.patch(install_free_tensors=True):
        assert_equal_tensors(run("neuron"), run("cpu"))
    # the attribute path really ran: parameters, buffers, the plain attribute and both closed-over tensors
    assert len(lifted) == 9 + 5 + 2


def test_inputs_sharing_a_storage_equal_eager_even_after_a_compile_for_separate_inputs():
    """A tensor and its view, one mutated: compiled for aliasing inputs, also when the caches
    already hold the same graph compiled for separate inputs (AOTAutograd's cache key leaves
    out aliasing, so such graphs skip it)."""
    def f(a, b):
        a.add_(1)
        return b * 2

    compiled_on("neuron", f)(torch.zeros(6, device="neuron"), torch.zeros(4, device="neuron"))
    base = torch.arange(6.0)
    expected = f(base, base[2:])  # eager CPU: the oracle (Inductor's warm cache gets this wrong)
    base_neuron = torch.arange(6.0).to("neuron")
    out = compiled_on("neuron", f)(base_neuron, base_neuron[2:])
    assert_equal_tensors([out, base_neuron], [expected, base])


def test_lifting_never_takes_a_tensor_off_the_users_own_submodule():
    # A graph that calls a submodule and also reads its weight: the host copy shares that
    # submodule with the user's module, so lifting its weight would delete the user's parameter.
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sub = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.sub(x) + self.sub.weight.sum()

    traced = torch.fx.symbolic_trace(Model())
    assert {n.op for n in traced.graph.nodes} >= {"call_module", "get_attr"}
    copy = host_graph.copy_graph_module(traced)
    with pytest.raises(NotImplementedError, match="sub.weight"):
        host_graph.lift_tensor_attributes(copy, FakeTensorMode(), traced)
    assert isinstance(traced.sub.weight, torch.nn.Parameter)
