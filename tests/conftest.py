"""Fixtures shared by several test files (helpers that are not fixtures live in the package
tests/helpers/: isolated, oracle, sweeps), and how a run is laid out: one compile cache for the
whole run, and the longest files started first."""
import os
import shutil
import tempfile

import pytest
import torch
import torch._dynamo

# The files that take longest, longest first. `make test` hands whole files to its workers
# (pytest-xdist, --dist loadfile) in collection order: these start first, so that no long file
# is left running alone at the end. The other files follow in pytest's order.
LONGEST_FILES = (
    "test_seed_examples_compiled.py",
    "test_distributed.py",
    "test_clean_exit.py",
    "test_seed_examples.py",
    "test_compile_cache_processes.py",
)

SHARED_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"


def pytest_configure(config):
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False  # xdist would order the files by their number of tests
    # One compile cache for the run, created empty by the controller (or the only process) and
    # inherited by the xdist workers and every program a test starts: a graph compiled by one test
    # is loaded by the next that compiles it (the cache locks per entry, so workers share it). Tests
    # about compiling and caching choose their own directory (fresh_compile, tmp_path).
    if not hasattr(config, "workerinput"):
        config.shared_compile_cache = tempfile.mkdtemp(prefix="torch-neuronx-tests-cache-")
        os.environ[SHARED_CACHE_ENV] = config.shared_compile_cache


def pytest_unconfigure(config):
    directory = getattr(config, "shared_compile_cache", None)
    if directory:
        if os.environ.get(SHARED_CACHE_ENV) == directory:
            del os.environ[SHARED_CACHE_ENV]
        shutil.rmtree(directory, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order


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
