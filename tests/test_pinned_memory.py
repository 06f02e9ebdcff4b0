"""Pinned host memory: pin_memory() and a non-blocking copy from it to neuron."""
import torch

N = "neuron"


def test_pin_memory():
    x = torch.randn(16).pin_memory()
    assert x.is_pinned()
    assert torch.equal(x.to(N, non_blocking=True).cpu(), x)
