"""torch.neuron, torch.accelerator and RNG: the device API users call."""
import pytest
import torch

N = "neuron"


def test_neuron_is_torchs_accelerator():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch._C._get_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == torch.neuron.device_count() == 4
    assert torch._C._get_privateuse1_backend_name() == "neuron"


def test_device_api_basics():
    assert torch.neuron.is_available()
    assert torch.neuron.current_device() == 0
    assert torch.neuron.get_amp_supported_dtype() == [torch.float32, torch.float16, torch.bfloat16]
    assert torch.neuron.is_bf16_supported()
    torch.neuron.synchronize()
    torch.neuron.synchronize("neuron:1")
    torch.neuron.empty_cache()
    torch.neuron.init()
    assert torch.neuron.is_initialized()


def test_set_device_and_context():
    try:
        torch.neuron.set_device(2)
        assert torch.neuron.current_device() == 2
        assert torch.empty(1, device=N).device == torch.device("neuron:2")
        assert torch.ones(2).to(N).device.index == 2
        with torch.neuron.device(3):
            assert torch.neuron.current_device() == 3
            assert torch.accelerator.current_device_index() == 3
        assert torch.neuron.current_device() == 2
        torch.neuron.set_device("neuron:1")
        assert torch.neuron.current_device() == 1
        torch.accelerator.set_device_index(0)
        assert torch.neuron.current_device() == 0
        x = torch.zeros(1, device="neuron:3")
        with torch.neuron.device_of(x):
            assert torch.neuron.current_device() == 3
    finally:
        torch.neuron.set_device(0)


def test_ops_follow_their_inputs_device():
    x = torch.randn(4, device="neuron:2")
    assert (x + x).device.index == 2
    assert x.sum().device.index == 2
    assert torch.neuron.current_device() == 0


@pytest.mark.parametrize("bad", [4, 99, -2])
def test_bad_device_index_names_the_valid_range(bad):
    with pytest.raises((RuntimeError, ValueError), match=r"valid indices are 0 to 3"):
        torch.neuron.set_device(bad)
    if bad >= 0:
        with pytest.raises(RuntimeError, match=r"neuron:%d.*valid indices are 0 to 3" % bad):
            torch.empty(2, device=f"neuron:{bad}")
        with pytest.raises(RuntimeError, match=r"valid indices are 0 to 3"):
            torch.ones(2).to(f"neuron:{bad}")
    assert torch.neuron.current_device() == 0


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="Expected a neuron device"):
        torch.neuron.set_device("cpu")


def test_mixing_neuron_and_cpu_tensors_is_a_device_mismatch():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        torch.ones(3, device=N) + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        torch.mm(torch.ones(2, 2, device=N), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        torch.where(torch.ones(3, device=N) > 0, torch.ones(3), torch.zeros(3, device=N))
    with pytest.raises(RuntimeError, match="neuron:0 and neuron:1"):
        torch.ones(3, device=N) * torch.ones(3, device="neuron:1")


@pytest.mark.parametrize("make", [
    lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (3,), device="neuron"),
    lambda: torch.randn(3, 3).to_sparse().to("neuron"),
    lambda: torch.randn(3, 3, device="neuron").to_sparse(),
    lambda: torch.randn(3, 3).to_sparse_csr().to("neuron"),
    lambda: torch.quantize_per_tensor(torch.randn(3, device="neuron"), 0.1, 0, torch.qint8),
    # a strided nested tensor can be built (no op runs), its first op raises
    lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], device="neuron") + 1,
], ids=["sparse_coo", "sparse_to", "to_sparse", "sparse_csr", "quantized", "nested"])
def test_unsupported_layouts_raise_clearly(make):
    with pytest.raises((RuntimeError, NotImplementedError), match="not supported on neuron"):
        make()
    assert (torch.ones(2, device=N) + 1).sum().item() == 4  # the device still works


def test_rng_seeded_by_torch_and_neuron_manual_seed():
    torch.manual_seed(123)
    a = torch.randn(5, device=N)
    torch.manual_seed(123)
    b = torch.randn(5, device=N)
    assert torch.equal(a.cpu(), b.cpu())
    torch.neuron.manual_seed(7)
    c = torch.rand(4, device=N)
    torch.neuron.manual_seed(7)
    assert torch.equal(c.cpu(), torch.rand(4, device=N).cpu())
    assert torch.neuron.initial_seed() == 7


def test_rng_is_independent_of_the_cpu_stream():
    torch.manual_seed(0)
    x1 = torch.randn(3, device=N)
    x2 = torch.randn(3, device=N)
    torch.manual_seed(0)
    y1 = torch.randn(3, device=N)
    torch.randn(100)  # consuming the CPU stream must not shift the neuron stream
    y2 = torch.randn(3, device=N)
    assert torch.equal(x1.cpu(), y1.cpu()) and torch.equal(x2.cpu(), y2.cpu())
    # same seed, same numbers as CPU (the neuron generator wraps a CPU one)
    torch.manual_seed(5)
    assert torch.equal(torch.randn(6, device=N).cpu(), torch.randn(6, generator=torch.Generator().manual_seed(5)))


def test_rng_state_round_trip_and_per_device():
    torch.neuron.manual_seed_all(3)
    state = torch.neuron.get_rng_state()
    first = torch.rand(4, device=N).cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(first, torch.rand(4, device=N).cpu())
    states = torch.neuron.get_rng_state_all()
    assert len(states) == 4
    d1 = torch.rand(4, device="neuron:1").cpu()
    torch.neuron.set_rng_state_all(states)
    assert torch.equal(d1, torch.rand(4, device="neuron:1").cpu())
    # devices have their own streams
    torch.neuron.manual_seed(1)
    with torch.neuron.device(2):
        torch.neuron.manual_seed(2)
    torch.neuron.seed()
    torch.neuron.seed_all()
    assert len(torch.neuron.default_generators) == 4


def test_explicit_neuron_generator_and_dropout():
    g = torch.Generator(device=N).manual_seed(11)
    a = torch.randn(4, generator=g, device=N)
    g.manual_seed(11)
    assert torch.equal(a.cpu(), torch.randn(4, generator=g, device=N).cpu())
    assert g.device == torch.device("neuron:0")
    torch.manual_seed(0)
    d = torch.nn.functional.dropout(torch.ones(1000, device=N), 0.5)
    kept = (d > 0).float().mean().item()
    assert 0.4 < kept < 0.6
    torch.manual_seed(0)
    assert torch.equal(d.cpu(), torch.nn.functional.dropout(torch.ones(1000, device=N), 0.5).cpu())


def test_fork_rng_restores_neuron_state():
    torch.manual_seed(0)
    with torch.random.fork_rng(device_type="neuron"):
        torch.randn(10, device=N)
    after = torch.randn(3, device=N).cpu()
    torch.manual_seed(0)
    assert torch.equal(after, torch.randn(3, device=N).cpu())


def test_pin_memory():
    x = torch.randn(16).pin_memory()
    assert x.is_pinned()
    assert torch.equal(x.to(N, non_blocking=True).cpu(), x)
