"""Fixtures shared by several test files (helpers that are not fixtures live in the package
tests/helpers/: isolated, oracle, sweeps), and how a run is laid out: one compile cache for the
whole run, one store of built C++ libraries for the whole run, and the longest files started first."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch
import torch._dynamo
import torch._inductor.config

# The files that take longest, longest first. `make test` hands whole files to its workers
# (pytest-xdist, --dist loadfile) in collection order: these start first, so that no long file
# is left running alone at the end. The other files follow in pytest's order.
LONGEST_FILES = (
    "test_distributed.py",
    "test_compile_cache_processes.py",
    "test_seed_examples_compiled.py",
    "test_seed_examples.py",
    "test_opinfo.py",
    "test_clean_exit.py",
)

SHARED_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
# The compiler Inductor is given for the run (tests/helpers/cxx_cache/g++), the real one it runs,
# and where it keeps what it built. Not TORCH_NEURONX_*/NEURON_* names: some tests start programs
# without those.
CXX_CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "cxx_cache", "g++")
REAL_CXX_ENV, CXX_STORE_ENV = "TESTS_REAL_CXX", "TESTS_CXX_CACHE_DIR"
FX_GRAPH_CACHE_ENV = "TORCHINDUCTOR_FX_GRAPH_CACHE_DEFAULT"  # a default: the backend's config.patch still wins


def pytest_configure(config):
    # `make test` leaves these out to stay within its time; `make test-long` (and CI) runs them.
    config.addinivalue_line("markers", "long: minutes of compiling (xla training); run by make test-long")
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False  # xdist would order the files by their number of tests
    # One compile cache for the run, created empty by the controller (or the only process) and
    # inherited by the xdist workers and every program a test starts: a graph compiled by one test
    # is loaded by the next that compiles it (the cache locks per entry, so workers share it). Tests
    # about compiling and caching choose their own directory (fresh_compile, tmp_path).
    if not hasattr(config, "workerinput"):
        config.shared_compile_cache = tempfile.mkdtemp(prefix="torch-neuronx-tests-cache-")
        os.environ[SHARED_CACHE_ENV] = config.shared_compile_cache
        _share_built_libraries(config)
        # Inductor's own FX graph cache (in /tmp, shared by every run on the machine) keys its code
        # without the vector ISA: code generated in a run at the machine's best ISA would be reused
        # by a run under ATEN_CPU_CAPABILITY=avx2 or =default, and fail to build. So compiles outside
        # the neuron backend (the oracle, Inductor on CPU) do not cache; the backend keeps its caches,
        # keyed by the ISA (graph_cache.vector_isa_inputs).
        config.fx_cache_saved = os.environ.get(FX_GRAPH_CACHE_ENV)
        os.environ[FX_GRAPH_CACHE_ENV] = "0"
    # The first set_device of a process chooses the device of every thread that never chose one (as on
    # TorchNeuron): choose neuron:0 now, so that a test selecting another device does not move it for later ones.
    if torch.neuron.is_available():
        torch.neuron.set_device(0)
    if os.environ.get(FX_GRAPH_CACHE_ENV) == "0":
        torch._inductor.config.fx_graph_cache = False  # this process read the variable before it was set
    if os.environ.get("CXX") == CXX_CACHE:
        # This process read CXX when it imported torch (above), maybe before it was set.
        torch._inductor.config.cpp.cxx = (None, CXX_CACHE)


def _share_built_libraries(config):
    """Inductor compiles each graph's kernels, and its ISA probes, into its working cache; tests
    about compiling give every process a cold one, so the same libraries were built again in each
    (g++ is most of a small compile). For the run, Inductor's compiler is a wrapper that builds each
    library once and copies it after (same source bytes, same arguments). Only with g++, the
    compiler Inductor uses on Linux unless CXX names another."""
    real = shutil.which(os.environ.get("CXX", "g++"))
    if real is None or os.environ.get("CXX") == CXX_CACHE or not os.access(CXX_CACHE, os.X_OK) \
            or "clang" in os.path.basename(real) or "g++" not in os.path.basename(real):
        return
    config.cxx_store = tempfile.mkdtemp(prefix="torch-neuronx-tests-cxx-")
    config.cxx_saved = {name: os.environ.get(name) for name in ("CXX", REAL_CXX_ENV, CXX_STORE_ENV)}
    os.environ.update({"CXX": CXX_CACHE, REAL_CXX_ENV: real, CXX_STORE_ENV: config.cxx_store})


def pytest_unconfigure(config):
    if hasattr(config, "fx_cache_saved"):
        if config.fx_cache_saved is None:
            os.environ.pop(FX_GRAPH_CACHE_ENV, None)
        else:
            os.environ[FX_GRAPH_CACHE_ENV] = config.fx_cache_saved
    directory = getattr(config, "shared_compile_cache", None)
    if directory:
        if os.environ.get(SHARED_CACHE_ENV) == directory:
            del os.environ[SHARED_CACHE_ENV]
        shutil.rmtree(directory, ignore_errors=True)
    store = getattr(config, "cxx_store", None)
    if store:
        for name, value in config.cxx_saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(store, ignore_errors=True)


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


# ---- the simulator's command line, run in forked children of one warm process --------------------
@pytest.fixture(scope="module")
def server():
    """One warm process (tests/helpers/simulate_server.py) forks each run: the imports are paid once."""
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "helpers", "simulate_server.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


@pytest.fixture
def simulate(server):
    """simulate(dir, *args, env=None) -> (CompletedProcess-like, plan or None): the CLI with --quiet."""
    def run(tmp_path, *args, env=None):
        out = tmp_path / "plan"
        tmp_path.mkdir(parents=True, exist_ok=True)
        request = {"argv": ["--quiet", "--out", str(out), *args], "env": env or {},
                   "stdout": str(tmp_path / "stdout"), "stderr": str(tmp_path / "stderr")}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        code = json.loads(server.stdout.readline())["returncode"]
        r = subprocess.CompletedProcess(request["argv"], code, (tmp_path / "stdout").read_text(),
                                        (tmp_path / "stderr").read_text())
        plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else None
        return r, plan
    return run
