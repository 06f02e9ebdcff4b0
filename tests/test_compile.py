"""torch.compile(backend="neuron"): same results as Inductor on CPU (the same generated code runs
on the same bytes), TorchNeuron's contract (static shapes, options, fallback), and metrics."""
import copy
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch._dynamo

import torch_neuronx
from torch_neuronx import neuron_dynamo_backend as backend

from helpers import isolated


pytestmark = pytest.mark.usefixtures("fresh_compile")


class Block(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (u.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for u in self.qkv(self.norm(x)).chunk(3, -1))
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(x)


def pair(model):
    """(Inductor on CPU, neuron compiled) copies of ``model``."""
    cpu = copy.deepcopy(model)
    neuron = copy.deepcopy(model).to("neuron")
    return (torch.compile(cpu, backend="inductor", fullgraph=True, dynamic=False),
            torch.compile(neuron, backend="neuron", fullgraph=True, dynamic=False), cpu, neuron)


def test_forward_matches_inductor_and_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    compiled_cpu, compiled_neuron, _, _ = pair(model)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        expected = compiled_cpu(x)
        out = compiled_neuron(x.to("neuron"))
    assert out.device.type == "neuron"
    assert torch.equal(out.cpu(), expected)
    torch.testing.assert_close(out.cpu(), model(x).detach(), rtol=1e-5, atol=1e-5)
    [m] = torch.neuron.get_dynamo_metrics()  # TorchNeuron's alias of neuron_dynamo_backend's
    assert m["cache"] == "miss" and m["graph_node_count"] > 10 and not m["has_collectives"]
    assert m["compile_us"] > 0 and m["fx_passes_us"] > 0 and m["graph_name"] == "neuron_graph_0"


def test_training_matches_inductor():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), torch.nn.Linear(32, 4))
    compiled_cpu, compiled_neuron, cpu, neuron = pair(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, neuron)]
    for step in range(3):
        x = torch.randn(2, 8, 32)
        losses = []
        for compiled, opt, device in zip((compiled_cpu, compiled_neuron), opts, ("cpu", "neuron")):
            loss = compiled(x.to(device)).square().mean()
            loss.backward()
            losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        assert losses[0] == losses[1], step
    for p_cpu, p in zip(cpu.parameters(), neuron.parameters()):
        assert p.device.type == "neuron" and torch.equal(p.detach().cpu(), p_cpu.detach())


def test_views_mutation_buffers_and_factories():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)

        def forward(self, x, acc):
            acc.add_(x.sum(0))                        # input mutation inside the graph
            y = self.bn(x)                            # running stats: buffers mutated in the graph
            ones = torch.ones(x.shape, device=x.device)  # factory with device=x.device
            return (y + ones)[:, 1:], x.t()           # a view of the input as an output

    torch.manual_seed(0)
    model = Odd()
    compiled_cpu, compiled_neuron, cpu, neuron = pair(model)
    base = torch.randn(6, 8)
    x_cpu, x_neuron = base[:, ::2], base.to("neuron")[:, ::2]  # non-contiguous view inputs
    acc_cpu, acc_neuron = torch.zeros(4), torch.zeros(4, device="neuron")
    version = acc_neuron._version
    expected = compiled_cpu(x_cpu, acc_cpu)
    out = compiled_neuron(x_neuron, acc_neuron)
    assert torch.equal(out[0].detach().cpu(), expected[0].detach())
    assert torch.equal(out[1].cpu(), expected[1]) and out[1].data_ptr() == x_neuron.data_ptr()
    assert torch.equal(acc_neuron.cpu(), acc_cpu) and acc_neuron._version > version
    assert torch.equal(neuron.bn.running_mean.cpu(), cpu.bn.running_mean)
    assert int(neuron.bn.num_batches_tracked) == 1


def test_recompiles_only_for_new_shapes():
    model = torch.nn.Linear(8, 8).to("neuron")
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    with torch.no_grad():
        for _ in range(5):  # more "diffusion steps": same shapes, no recompile
            compiled(torch.randn(2, 8, device="neuron"))
        compiled(torch.randn(3, 8, device="neuron"))  # a new shape: one new graph, still static
        compiled(torch.randn(2, 8, device="neuron"))  # seen before: reused
    metrics = backend.get_dynamo_metrics()
    assert len(metrics) == 2


def test_dynamic_true_is_rejected():
    compiled = torch.compile(torch.nn.Linear(4, 4).to("neuron"), backend="neuron", dynamic=True)
    with pytest.raises(Exception, match=r"dynamic=True\) is not supported"):
        compiled(torch.randn(2, 4, device="neuron"))


def test_options_and_mode():
    model = torch.nn.Linear(4, 4).to("neuron")
    with pytest.raises(Exception, match=r"unknown options \['bogus'\]; the known options are"):
        torch.compile(model, backend="neuron", options={"bogus": 1})(torch.randn(2, 4, device="neuron"))
    torch._dynamo.reset()
    backend.set_model_name("unet")
    try:
        compiled = torch.compile(model, backend="neuron", options={"model_name": "flux", "fallback_execution": False})
        compiled(torch.randn(2, 4, device="neuron"))
        with pytest.warns(UserWarning, match="ignores mode='max-autotune'"):
            torch.compile(torch.nn.Linear(4, 4).to("neuron"), backend="neuron", mode="max-autotune")(
                torch.randn(2, 4, device="neuron"))
    finally:
        backend.set_model_name(None)
    assert [m["model_name"] for m in backend.get_dynamo_metrics()] == ["flux", "unet"]


@pytest.mark.parametrize("fallback", ["1", "0"])
def test_compile_failure_raises_or_falls_back(monkeypatch, fallback):
    import torch._inductor.compile_fx as compile_fx_module

    def broken(*args, **kwargs):
        raise RuntimeError("simulated compiler crash")

    monkeypatch.setattr(compile_fx_module, "compile_fx", broken)
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", fallback)
    model = torch.nn.Linear(4, 4).to("neuron")
    x = torch.randn(2, 4, device="neuron")
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    if fallback == "1":
        with pytest.raises(Exception, match="neuron failed to compile graph .*simulated compiler crash"):
            compiled(x)
        return
    with pytest.warns(RuntimeWarning, match="running it eagerly"):
        out = compiled(x)
    assert torch.equal(out.detach().cpu(), model(x).detach().cpu())
    assert backend.get_dynamo_metrics()[0]["fell_back"]


def test_graph_breaks():
    def f(x):
        x = x * 2
        print("graph break")  # noqa: T201 - a deliberate graph break
        return x + 1

    x = torch.randn(4, device="neuron")
    with pytest.raises(Exception, match="print"):
        torch.compile(f, backend="neuron", fullgraph=True)(x)
    torch._dynamo.reset()
    out = torch.compile(f, backend="neuron", fullgraph=False)(x)
    assert torch.equal(out.cpu(), x.cpu() * 2 + 1)
    assert len(backend.get_dynamo_metrics()) == 2


def test_repeated_blocks_compile_once_per_class():
    from diffusers.models.modeling_utils import ModelMixin

    class Tower(ModelMixin):
        _repeated_blocks = ["Block"]

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(4))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    model = Tower().to("neuron")
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        expected = model(x.to("neuron")).cpu()
        model.compile_repeated_blocks(backend="neuron", fullgraph=True, dynamic=False)
        out = model(x.to("neuron"))
    assert len(backend.get_dynamo_metrics()) == 1  # four blocks, one compile
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_runtime_failure_is_a_neff_execution_error():
    from torch_neuronx.neuron_dynamo_backend import bridge

    def broken(*args):
        raise ValueError("simulated kernel failure")

    run = bridge.run_graph_on_neuron(broken)  # the wrapper every compiled graph gets
    x = torch.randn(2, 4, device="neuron")
    with pytest.raises(backend.NEFFExecutionError, match="simulated kernel failure") as info:
        run(x)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="without _enter_compiled_call"):  # the alias frame was popped
        torch.ops.neuron._exit_compiled_call([])


def test_gradients_of_an_input_passed_twice_to_a_compiled_graph_match_cpu():
    # One alias serves both slots: each slot must still get its gradient edge.
    from torch_neuronx.neuron_dynamo_backend import bridge

    w0 = torch.randn(3, 3)
    w_cpu = w0.clone().requires_grad_()
    (w_cpu * w_cpu.t()).sum().backward()
    w = w0.to("neuron").requires_grad_()
    (out,) = bridge.run_graph_on_neuron(lambda a, b: [(a * b.t()).sum()])(w, w)
    out.backward()
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad, rtol=0, atol=0)


def test_gradients_through_a_compiled_graph_match_cpu_at_the_edges():
    # The wrapper every compiled graph gets, around a CPU function with the awkward outputs: an
    # input returned as is, an output without a gradient, an integer output; and a CPU input.
    from torch_neuronx.neuron_dynamo_backend import bridge

    def graph(w, x, scale):
        h = x @ w * scale
        return h, w, h.detach() + 1, h.argmax(dim=1)

    def cpu_run(w, x, scale):
        h, w_out, plain, index = graph(w, x, scale)
        loss = (h ** 2).sum() + (w_out * 3).sum()
        loss.backward()
        return h, plain, index

    w0, x0 = torch.randn(4, 3), torch.randn(2, 4)
    w_cpu, scale_cpu = w0.clone().requires_grad_(), torch.tensor(2.0, requires_grad=True)
    expected = cpu_run(w_cpu, x0, scale_cpu)

    w, scale = w0.to("neuron").requires_grad_(), torch.tensor(2.0, requires_grad=True)  # scale stays on CPU
    h, w_out, plain, index = bridge.run_graph_on_neuron(graph)(w, x0.to("neuron"), scale)
    ((h ** 2).sum() + (w_out * 3).sum()).backward()

    assert w.is_leaf and w.grad_fn is None and w_out is not w  # the returned input got its own tensor
    assert not plain.requires_grad and not index.requires_grad
    assert w.grad.device.type == "neuron" and scale.grad.device.type == "cpu"
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad, rtol=0, atol=0)
    torch.testing.assert_close(scale.grad, scale_cpu.grad, rtol=0, atol=0)
    for got, want in zip((h, plain, index), expected):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=0, atol=0)


PROGRAM_CALLING_THE_BACKEND = os.path.join(os.path.dirname(__file__), "programs", "compiled_calls_into_the_backend.py")


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
@pytest.mark.parametrize("executor", ["inductor", "xla"])
def test_dynamo_never_traces_the_backends_own_python(executor, tmp_path):
    """Compiled functions that call backward, an optimizer step, a collective, torch.neuron's queries
    and the diagnostics: Dynamo traces the user's frames and torch's, never one of torch_neuronx's
    (torch_neuronx/interop/dynamo_rules.py); the train step equals CPU eager over 3 steps within float32
    rounding (Inductor and XLA order a matmul's sums otherwise than eager)."""
    proc = subprocess.run([sys.executable, PROGRAM_CALLING_THE_BACKEND, str(tmp_path / "rendezvous")],
                          env=isolated.environment(TORCH_LOGS="dynamo", TORCH_NEURONX_COMPILE_EXECUTOR=executor,
                                                   TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff")),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traced = re.findall(r"torchdynamo start tracing (\S+) (\S+):\d+", proc.stderr)
    assert any(path == PROGRAM_CALLING_THE_BACKEND for _, path in traced), traced  # the log is read right
    package = os.path.dirname(torch_neuronx.__file__)
    assert not [(name, path) for name, path in traced if path.startswith(package)]
    results = json.loads(proc.stdout.split("RESULTS ", 1)[1])
    torch.testing.assert_close(results["compiled"], results["eager"], rtol=1e-5, atol=1e-6)
    assert results["params_difference"] < 1e-5
    capacity = torch.neuron.get_device_properties(0).total_memory / 2 ** 40
    scale = torch.neuron.device_count() + 0 + 1
    assert results["queries"] == [i * scale + capacity for i in range(4)]  # folded to constants, fullgraph
    assert results["memory"][0] == [1.0, 2.0, 3.0, 4.0] and results["memory"][1] > 0
    assert results["observed"] == [0.0, 2.0, 4.0, 6.0]
    assert results["collective"] == [1.0, 3.0, 5.0, 7.0]  # one rank: all_reduce keeps the values


class Dropouts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 16)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, q, k, v, x):
        x = self.drop(torch.nn.functional.gelu(self.fc1(x)))
        x = torch.nn.functional.dropout(self.fc2(x), 0.5, training=True)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
        return x, attn


def test_compiled_random_ops_draw_as_eager_does_on_cpus_generator():
    """TorchNeuron's random-op legalization draws dropout masks outside the graph, so under one seed
    a compiled dropout equals the eager one; here the graph's random ops run as CPU's eager kernels
    in the graph's order (Inductor's fallback_random), forward and backward."""
    torch.manual_seed(0)
    model = Dropouts().train()
    inputs = [torch.randn(2, 2, 8, 4), torch.randn(2, 2, 8, 4), torch.randn(2, 2, 8, 4), torch.randn(4, 32)]
    torch.manual_seed(42)
    eager = model(*inputs)
    sum(o.sum() for o in eager).backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    neuron = copy.deepcopy(model).to("neuron")
    neuron.zero_grad()
    compiled = torch.compile(neuron, backend="neuron", fullgraph=True, dynamic=False)
    torch.manual_seed(42)
    out = compiled(*(t.to("neuron") for t in inputs))
    sum(o.sum() for o in out).backward()
    for got, expected in zip(out, eager):
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)
    for p, expected in zip(neuron.parameters(), eager_grads):
        torch.testing.assert_close(p.grad.cpu(), expected, rtol=1e-5, atol=1e-6)
    torch.manual_seed(42)
    again = compiled(*(t.to("neuron") for t in inputs))
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(again, out))  # the same seed, the same draws
