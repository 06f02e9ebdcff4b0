"""Where other libraries meet neuron: calls that fail on Trainium fail here too, with an error that
names the problem and the fix, and the working paths give CPU's numbers. Each root cause found by
running diffusers' own tests on neuron has a test here (CI cannot fetch diffusers' repository).

- torch.compile's default backend (Inductor) on neuron tensors: one InductorOnNeuronError naming
  backend="neuron", raised before Inductor lowers anything; CPU Inductor and backend="neuron" unharmed.
- safetensors given device="neuron": safetensors' own error (its device list is fixed); loading to
  CPU then .to("neuron"), or device=0, gives the saved tensors on neuron.
"""
import gc

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from torch_neuronx.interop.ecosystem_errors import InductorOnNeuronError

N = "neuron"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    gc.collect()


class Net(torch.nn.Module):  # a user's module (Dynamo skips torch's own forward methods under module.compile())
    def __init__(self):
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.linear(x)))


def _model():
    torch.manual_seed(0)
    return Net()


def _inner(error: BaseException) -> BaseException:
    """The error Dynamo wrapped (BackendCompilerFailed keeps it as inner_exception / __cause__)."""
    return getattr(error, "inner_exception", None) or error.__cause__ or error


# ---- Inductor on neuron tensors ------------------------------------------------------------------
@pytest.mark.parametrize("how", ["torch.compile", "module.compile", "fullgraph"])
def test_inductor_on_neuron_names_the_neuron_backend(how):
    model, x = _model().to(N), torch.randn(4, 8).to(N)
    if how == "module.compile":
        model.compile()
        compiled = model
    else:
        compiled = torch.compile(model, fullgraph=how == "fullgraph")
    with pytest.raises(BackendCompilerFailed) as caught:
        compiled(x)
    inner = _inner(caught.value)
    assert isinstance(inner, InductorOnNeuronError), repr(inner)
    assert 'backend="neuron"' in str(caught.value) and "Inductor" in str(caught.value)


def test_inductor_on_neuron_fails_before_lowering():
    """One clear error at Inductor's first question, not a KeyError or a LoweringException inside it."""
    def pointwise(a, b):  # lowered by Inductor's pointwise path (it asks the backend's features)
        return (a * b + 1).relu().sum(dim=0)

    with pytest.raises(BackendCompilerFailed) as caught:
        torch.compile(pointwise)(torch.ones(3, 4, device=N), torch.ones(3, 4, device=N))
    assert isinstance(_inner(caught.value), InductorOnNeuronError)
    assert "KeyError" not in str(caught.value) and "LoweringException" not in str(caught.value)


def test_cpu_inductor_and_the_neuron_backend_still_work_after_the_error():
    model, x = _model(), torch.randn(4, 8)
    expected = model(x)
    with pytest.raises(BackendCompilerFailed):
        torch.compile(_model().to(N))(x.to(N))
    torch._dynamo.reset()
    on_cpu = torch.compile(model)(x)  # Inductor for CPU: the neuron hook is never asked
    torch.testing.assert_close(on_cpu, expected)
    torch._dynamo.reset()
    on_neuron = torch.compile(_model().to(N), backend=N)(x.to(N))  # Inductor's CPU code, on neuron bytes
    assert on_neuron.device.type == N
    torch.testing.assert_close(on_neuron.cpu(), on_cpu, rtol=0, atol=0)


def test_torch_neuron_exposes_the_inductor_hook_that_raises():
    from torch.utils.backend_registration import _get_custom_mod_func

    for name in ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"):
        hook = _get_custom_mod_func(name)
        with pytest.raises(InductorOnNeuronError, match='backend="neuron"'):
            hook(None)
        with pytest.raises(InductorOnNeuronError):
            hook.supports_caching
    with pytest.raises(AttributeError):
        torch.neuron.NoSuchThing


# ---- safetensors and the neuron device -----------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    from safetensors.torch import save_file

    tensors = {"w": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int32)}
    path = str(tmp_path / "t.safetensors")
    save_file(tensors, path)
    return path, tensors


@pytest.mark.parametrize("device", ["neuron", "neuron:0", torch.device("neuron", 0)])
def test_safetensors_rejects_the_neuron_name_as_on_trainium(saved, device):
    import safetensors.torch

    path, _ = saved
    with pytest.raises(Exception, match="is invalid") as caught:
        safetensors.torch.load_file(path, device=device)
    assert type(caught.value).__name__ == "SafetensorError"


@pytest.mark.parametrize("path_kind", ["cpu then .to", "device index"])
def test_safetensors_working_paths_to_neuron(saved, path_kind):
    import safetensors.torch

    path, tensors = saved
    if path_kind == "cpu then .to":
        loaded = {k: v.to(N) for k, v in safetensors.torch.load_file(path, device="cpu").items()}
    else:
        loaded = safetensors.torch.load_file(path, device=0)  # torch resolves 0 to the accelerator: neuron:0
    assert set(loaded) == set(tensors)
    for key, value in tensors.items():
        assert loaded[key].device == torch.device(N, 0)
        assert torch.equal(loaded[key].cpu(), value)


def test_diffusers_group_offloading_to_disk_on_neuron(tmp_path):
    """diffusers loads its disk groups with safetensors' device=<onload device type>: on neuron that is
    safetensors' error (on Trainium too); on CPU it works, and in-memory offloading to neuron matches CPU."""
    pytest.importorskip("diffusers")
    from diffusers import UNet2DModel

    def unet():
        torch.manual_seed(0)
        return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                           block_out_channels=(8, 16), norm_num_groups=4,
                           down_block_types=("DownBlock2D", "DownBlock2D"),
                           up_block_types=("UpBlock2D", "UpBlock2D")).eval()

    x, t = torch.randn(1, 3, 8, 8), torch.tensor([10])
    with torch.no_grad():
        expected = unet()(x, t).sample
        on_disk_cpu = unet()
        on_disk_cpu.enable_group_offload("cpu", offload_type="leaf_level", offload_to_disk_path=str(tmp_path / "c"))
        torch.testing.assert_close(on_disk_cpu(x, t).sample, expected, rtol=0, atol=0)

        on_disk = unet()
        on_disk.enable_group_offload(N, offload_type="leaf_level", offload_to_disk_path=str(tmp_path / "n"))
        with pytest.raises(Exception, match="device neuron is invalid"):
            on_disk(x.to(N), t.to(N))

        in_memory = unet()
        in_memory.enable_group_offload(N, offload_type="leaf_level")
        torch.testing.assert_close(in_memory(x.to(N), t.to(N)).sample.cpu(), expected, rtol=0, atol=0)


# ---- diffusers' test gate for neuron -------------------------------------------------------------
def test_diffusers_sees_torch_neuronx():
    # diffusers asks importlib.metadata for AWS's distribution name; ours answers it (distribution_alias),
    # so its @require_torch_neuron tests run here as on Trainium.
    pytest.importorskip("diffusers")
    import importlib.metadata

    from diffusers.utils import import_utils

    assert torch.neuron.is_available()
    import torch_neuronx

    # what diffusers' _is_package_available asks, under both spellings of AWS's name
    assert importlib.metadata.version("torch_neuronx") == importlib.metadata.version("torch-neuronx") == \
        torch_neuronx.__version__
    assert import_utils.is_torch_neuronx_available()
    # A listing of everything installed still has us once (pip list, diffusers' own package map).
    names = [d.metadata["Name"] for d in importlib.metadata.distributions()]
    assert names.count("torch-neuronx-cpu") == 1 and "torch-neuronx" not in names
