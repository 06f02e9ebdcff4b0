"""DLPack: neuron tensors export their bytes as host (kDLCPU) memory, without a copy."""
import numpy as np
import pytest
import torch
from torch.utils.dlpack import DLDeviceType

N = "neuron"


def test_dlpack_device_is_host_memory():
    assert torch.arange(3.0, device=N).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    assert torch.arange(3.0, device="neuron:1").__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    assert torch.arange(3.0).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)  # CPU: torch's own


def test_numpy_reads_and_writes_the_same_bytes():
    t = torch.arange(12.0, device=N).reshape(3, 4)
    a = np.from_dlpack(t)
    np.testing.assert_array_equal(a, t.cpu().numpy())
    a[1, 2] = -5.0  # a numpy write lands in neuron memory
    assert t[1, 2].item() == -5.0
    t.add_(1)  # a neuron op is seen by numpy
    assert a[0, 0] == 1.0


def test_non_contiguous_view_keeps_strides_and_offset():
    base = torch.arange(24.0, device=N).reshape(4, 6)
    view = base[1:, ::2]
    a = np.from_dlpack(view)
    np.testing.assert_array_equal(a, view.cpu().numpy())
    a[0, 0] = 100.0
    assert base[1, 0].item() == 100.0


def test_torch_from_dlpack_gives_a_cpu_tensor_on_the_same_memory():
    t = torch.arange(6, dtype=torch.int32, device=N)
    c = torch.from_dlpack(t)
    assert c.device.type == "cpu" and c.dtype == torch.int32
    assert c.data_ptr() == t.data_ptr()
    c[0] = 42
    assert t[0].item() == 42


def test_import_onto_neuron_copies():
    a = np.arange(4, dtype=np.float32)
    t = torch.from_dlpack(a, device=N)
    assert t.device.type == N
    torch.testing.assert_close(t.cpu(), torch.arange(4.0))
    a[0] = 9.0  # a copy: the neuron tensor keeps its value
    assert t[0].item() == 0.0


def test_round_trip_back_to_neuron():
    t = torch.randn(3, 5, device=N)
    back = torch.from_dlpack(torch.from_dlpack(t)).to(N)
    assert torch.equal(back.cpu(), t.cpu())


def test_capsule_keeps_the_bytes_alive():
    t = torch.arange(1000.0, device=N)
    capsule = t.__dlpack__()
    expected = t.cpu()
    del t
    torch.randn(1000, device=N)  # reuse of freed memory would show here
    assert torch.equal(torch.from_dlpack(capsule), expected)


def test_versioned_capsule():
    t = torch.arange(4.0, device=N)
    c = torch.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    assert c.data_ptr() == t.data_ptr()


def test_legacy_to_dlpack_round_trips_on_neuron():
    t = torch.arange(4.0, device=N)
    back = torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(t))
    assert back.device.type == N and back.data_ptr() == t.data_ptr()


def test_torch_refusals_are_torch_s():
    with pytest.raises(BufferError, match="require gradient"):
        torch.ones(2, device=N, requires_grad=True).__dlpack__()
    with pytest.raises(BufferError, match="conjugate bit"):
        torch.ones(2, dtype=torch.complex64, device=N).conj().__dlpack__()


def test_from_dlpack_with_a_device():
    t = torch.arange(3.0, device=N)
    on_cpu = torch.from_dlpack(t, device="cpu")  # the host view: no copy
    assert on_cpu.device.type == "cpu" and on_cpu.data_ptr() == t.data_ptr()
    on_neuron = torch.from_dlpack(t, device=N)  # host memory onto neuron: a copy, as CPU -> CUDA
    assert on_neuron.device.type == N and on_neuron.data_ptr() != t.data_ptr()
    assert torch.equal(on_neuron.cpu(), t.cpu())
