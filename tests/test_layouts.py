"""Tensor layouts neuron does not support (sparse, quantized, nested): a clear error, and the device
still works after it."""
import pytest
import torch

N = "neuron"


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
