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


@pytest.fixture
def collect():
    """Collect diagnostics for the test body only; yields a function returning the report so far."""
    import torch_neuronx
    from torch_neuronx import diagnostics

    torch_neuronx.clear_op_tracking()
    diagnostics.start()
    try:
        yield lambda: diagnostics.report("Trainium2:2")
    finally:
        diagnostics.stop()
        torch_neuronx.clear_op_tracking()
