"""aten::contiguous on neuron, as TorchNeuron registers it (python_ops/contiguous.py, with autograd):
CPU's values; preserve_format taken as contiguous (CPU refuses it); channels_last refused on Trainium,
so TORCH_NEURONX_EAGER_SEMANTICS=trainium raises and the readiness report says "would fail" at the
user's line, which PyTorch's composite (a clone above autograd) would hide from both."""
import inspect
import subprocess
import sys

import pytest
import torch

import torch_neuronx

from helpers import isolated
from helpers.oracle import assert_same

N = "neuron"
REFUSED = "Neuron tensors only support contiguous or preserve memory format"


def here() -> str:
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@pytest.mark.parametrize("shape, fmt", [((2, 3, 4, 5), torch.channels_last), ((2, 3, 2, 4, 5), torch.channels_last_3d),
                                        ((2, 3, 4, 5), torch.contiguous_format)])
def test_values_strides_and_gradients_are_cpus(shape, fmt):
    x = torch.randn(shape).transpose(1, 2)
    got_x = x.to(N).requires_grad_()
    want_x = x.clone().requires_grad_()
    got, want = got_x.contiguous(memory_format=fmt), want_x.contiguous(memory_format=fmt)
    assert_same(got, want)
    assert got.stride() == want.stride() and got.is_contiguous(memory_format=fmt)
    weight = torch.randn(want.shape)
    (got * weight.to(N)).sum().backward()
    (want * weight).sum().backward()
    assert_same(got_x.grad, want_x.grad)


def test_an_already_contiguous_tensor_is_returned_itself():
    x = torch.randn(3, 4, device=N)
    assert x.contiguous() is x and x.contiguous(memory_format=torch.preserve_format) is x
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last).to(N)
    assert cl.contiguous(memory_format=torch.channels_last) is cl


def test_preserve_format_means_contiguous_on_neuron_where_cpu_refuses_it():
    """tests/operations/test_memory_format_validation.py: preserve_format is taken and gives a contiguous
    result; CPU's composite raises."""
    x = torch.randn(3, 4).t()
    with pytest.raises(RuntimeError, match="preserve memory format is unsupported"):
        x.contiguous(memory_format=torch.preserve_format)
    y = x.to(N).contiguous(memory_format=torch.preserve_format)
    assert y.is_contiguous()
    assert_same(y, x.contiguous())


@pytest.mark.parametrize("grad", [True, False])
def test_trainium_semantics_refuse_channels_last_and_take_the_rest(grad):
    """tests/views/test_contiguous_ops.py, test_contiguous_rejects_unsupported_memory_format."""
    x = torch.randn(2, 3, 4, 5, device=N).requires_grad_(grad)
    with torch_neuronx.eager_semantics():
        with pytest.raises(RuntimeError, match=f"aten::contiguous: {REFUSED}"):
            x.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), pytest.raises(RuntimeError, match=REFUSED):
            x.detach().contiguous(memory_format=torch.channels_last)
        t = x.transpose(2, 3)
        assert_same(t.contiguous(memory_format=torch.preserve_format), t.detach().cpu().contiguous())
        assert_same(t.contiguous(), t.detach().cpu().contiguous())
    assert x.contiguous(memory_format=torch.channels_last).is_contiguous(memory_format=torch.channels_last)


def test_the_report_finds_a_refused_format_at_its_line_and_nothing_for_the_rest(collect):
    x = torch.randn(2, 3, 4, 5, device=N)
    x.transpose(2, 3).contiguous()
    x.transpose(2, 3).contiguous(memory_format=torch.preserve_format)
    x.clone(memory_format=torch.channels_last)  # clone keeps any format on TorchNeuron
    assert not [f for f in collect().findings if f.kind == "layout-change"]
    for _ in range(2):
        x.contiguous(memory_format=torch.channels_last); site = here()
    y = torch.randn(1, 2, 3, 4, 5, device=N).requires_grad_()
    y.contiguous(memory_format=torch.channels_last_3d); site_3d = here()
    found = {f.site: f for f in collect().findings if f.kind == "layout-change"}
    assert set(found) == {site, site_3d}
    assert found[site].ops == {"aten::contiguous": 2} and found[site].severity == "would-fail"
    assert "torch.channels_last)" in found[site].details[0]
    assert "channels_last_3d" in found[site_3d].details[0]


def test_a_compiled_function_keeps_pytorchs_composite():
    def f(x):
        return x.contiguous(memory_format=torch.channels_last) * 2

    x = torch.randn(2, 3, 4, 5)
    got = torch.compile(f, backend="neuron", fullgraph=True)(x.to(N))
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.cpu(), f(x), rtol=0, atol=0)


def test_fail_on_would_fail_stops_a_script_trainium_would_stop(tmp_path):
    (tmp_path / "nhwc.py").write_text("import torch\nx = torch.ones(2, 3, 4, 4, device='neuron')\n"
                                      "y = x.contiguous(memory_format=torch.channels_last)\n")
    gate = subprocess.run([sys.executable, "-m", "torch_neuronx.run", "--fail-on", "would-fail", "nhwc.py"],
                          capture_output=True, text=True, cwd=tmp_path, env=isolated.environment(), timeout=300)
    assert gate.returncode == 3, gate.stderr
    assert "nhwc.py:3" in gate.stdout + gate.stderr
