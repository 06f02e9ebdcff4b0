"""torch.neuron and torch.accelerator: the device count, the current device (set_device, the
device guard), device indices and their errors, and tensors of two devices in one op."""
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
