"""Fixtures shared by several test files (helpers that are not fixtures live in the package
tests/helpers/: isolated, oracle, sweeps)."""
import pytest
import torch
import torch._dynamo


@pytest.fixture
def fresh_compile(tmp_path, monkeypatch):
    """A compile cache of the test's own, and Dynamo and the backend's metrics reset around it."""
    from torch_neuronx import neuron_dynamo_backend

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    torch._dynamo.reset()
    neuron_dynamo_backend.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()
