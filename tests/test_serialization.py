"""torch.save/torch.load, deepcopy and safetensors with neuron tensors."""
import copy
import io

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.oracle import assert_same

N = "neuron"


def save_load(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def test_save_load_keeps_device_and_values():
    x = torch.randn(4, 5)
    loaded = save_load({"t": x.to("neuron:1"), "view": x.to(N)[1:3]})
    assert loaded["t"].device == torch.device("neuron:1")
    assert_same(loaded["t"], x)
    assert_same(loaded["view"], x[1:3])


@pytest.mark.parametrize("map_location,expected", [("cpu", "cpu"), ("neuron", "neuron:0"), ("neuron:2", "neuron:2")])
def test_map_location(map_location, expected):
    x = torch.arange(6.0).reshape(2, 3)
    loaded = save_load(x.to(N), map_location=map_location)
    assert loaded.device == torch.device(expected)
    assert torch.equal(loaded.cpu(), x)
    loaded = save_load(x, map_location=map_location)  # cpu checkpoint onto neuron
    assert loaded.device == torch.device(expected)


def test_state_dict_round_trip():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(N)
    model(torch.randn(3, 4, device=N))
    state = save_load(model.state_dict())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(N)
    fresh.load_state_dict(state)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert b.device.type == "neuron", k
        assert torch.equal(a.cpu(), b.cpu()), k


def test_deepcopy():
    x = torch.randn(3, 3, device=N, requires_grad=True)
    y = copy.deepcopy(x)
    assert y.device == x.device and y.requires_grad
    assert torch.equal(x.detach().cpu(), y.detach().cpu())
    with torch.no_grad():
        y.add_(1)
    assert not torch.equal(x.detach().cpu(), y.detach().cpu())
    model = torch.nn.Linear(3, 2).to(N)
    clone = copy.deepcopy(model)
    assert clone.weight.device.type == "neuron"
    assert clone.weight.data_ptr() != model.weight.data_ptr()


def test_storage_methods():
    s = torch.UntypedStorage(8).neuron()
    assert s.device.type == "neuron" and s.is_neuron
    assert torch.randn(2).untyped_storage().neuron().device.type == "neuron"
    cpu = torch.arange(4, dtype=torch.uint8)
    assert cpu.to(N).untyped_storage().cpu().tolist() == [0, 1, 2, 3]
    st = torch.zeros(4, device=N).untyped_storage()
    st.resize_(32)
    assert st.nbytes() == 32


def test_safetensors_load_then_move(tmp_path):
    tensors = {"w": torch.randn(4, 4), "b": torch.randn(4).to(torch.bfloat16)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    loaded = {k: v.to(N) for k, v in load_file(str(path)).items()}
    for k, v in tensors.items():
        assert_same(loaded[k], v)
    save_file({k: v.cpu() for k, v in loaded.items()}, str(tmp_path / "again.safetensors"))
