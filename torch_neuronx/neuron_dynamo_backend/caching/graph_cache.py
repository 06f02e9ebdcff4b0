"""Compiled graphs in the NEFF-style cache: their keys, and compile-or-load.

An entry holds Inductor's own cache artifacts for one forward/backward graph
(``torch.compiler.save_cache_artifacts``, TorchNeuron's "MegaCache") and the list of host
libraries it loads (:mod:`.libraries`), checksummed (and, with a key, signed) by :mod:`.neff_cache`.
Loading one writes the libraries a new working cache lacks and hot-loads the artifacts, so
Inductor finds the graph in its cache and generates and compiles nothing. Inductor's working
cache (generated code, built host libraries: code it loads unchecked) lives under the NEFF cache
directory when that is yours alone, in the local directory for a shared cache, or where the user
chose with ``TORCHINDUCTOR_CACHE_DIR``.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from typing import Any, Callable

import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from torch_neuronx.neuron_dynamo_backend.caching import isa_probe, libraries, neff_cache, trust
from torch_neuronx.runtime import warn_once
from torch_neuronx.version import __version__

# Inductor cache directories this module put in TORCHINDUCTOR_CACHE_DIR (one per NEFF cache directory used).
_inductor_dirs_set: set[str] = set()

CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"
# Bump when the host code we generate changes for the same graph.
ARTIFACT_FORMAT = "2"


def graph_key(gm: torch.fx.GraphModule, cpu_inputs, compile_kwargs: dict[str, Any]) -> str:
    """Everything that shapes the compiled code: the graph, its inputs' metadata (which inputs
    share a storage among it), how it is compiled, and the versions of torch, Inductor's
    configuration and this project."""
    from torch.multiprocessing.reductions import StorageWeakRef

    storages: dict[StorageWeakRef, int] = {}  # each storage numbered by its first input
    inputs = [(tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype), t.requires_grad,
               storages.setdefault(StorageWeakRef(t.untyped_storage()), len(storages)))
              if isinstance(t, torch.Tensor) else repr(t) for t in cpu_inputs]
    settings = {k: repr(v) for k, v in sorted(compile_kwargs.items()) if k != "graph_id"}
    return neff_cache.cache_key(gm.print_readable(print_output=False, include_stride=True, include_device=True),
                                repr(inputs), repr(settings), torch.__version__, __version__,
                                ARTIFACT_FORMAT, repr(torch._inductor.config.get_hash()), *vector_isa_inputs())


def vector_isa_inputs() -> tuple[str, str]:
    """What decides the vector instructions Inductor's host code uses: the CPU, and
    ATEN_CPU_CAPABILITY, which forces a lower set. Inductor's own cache keys leave both out, so code
    generated for AVX-512 would be reused (and fail to build, or fault) under a forced avx2/default."""
    return os.environ.get(CAPABILITY_ENV, "").strip().lower(), isa_probe.cpu_description()


def _working_dir(base: str) -> str:
    """Inductor's working cache under the NEFF cache: one per forced capability, since Inductor's
    own cache keys do not tell code generated for one vector ISA from code generated for another."""
    capability = vector_isa_inputs()[0]
    return os.path.join(base, f"capability-{capability}") if capability else base


def inputs_share_storage(cpu_inputs) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef

    storages = [StorageWeakRef(t.untyped_storage()) for t in cpu_inputs if isinstance(t, torch.Tensor)]
    return len(set(storages)) < len(storages)


@contextlib.contextmanager
def inductor_settings(aliased_inputs: bool = False):
    """Inductor's working cache where the NEFF cache keeps it (unless the user chose one; one per
    forced ATEN_CPU_CAPABILITY);
    its FX graph cache off when the NEFF cache is disabled, so a disabled cache really compiles.
    Inductor's CPU vector-ISA probes answered from the NEFF cache's records (:mod:`.isa_probe`).
    AOTAutograd's cache is skipped for a graph whose inputs share a storage: its key leaves out
    which inputs alias, so it would hand back code compiled for separate inputs."""
    cache = neff_cache.get_cache()
    per_capability = False  # whether Inductor's cache holds code for this capability only
    inductor_dir = working_directory(cache)
    if inductor_dir is not None and not _user_chose_inductor_cache_dir(inductor_dir):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir
        _inductor_dirs_set.add(inductor_dir)
        per_capability = True
    elif inductor_dir is None and os.environ.get("TORCHINDUCTOR_CACHE_DIR") in _inductor_dirs_set:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]  # ours from before: Inductor's default, not a refused one
    # Under a forced capability, Inductor's FX graph cache in a shared directory would hand back
    # code generated for the CPU's own (wider) ISA, which then fails to build.
    fx_graph_cache = cache.enabled and (per_capability or not vector_isa_inputs()[0])
    aot_cache = torch._functorch.config.enable_autograd_cache and fx_graph_cache and not aliased_inputs
    # Random ops run as eager CPU kernels, in the graph's order, on CPU's default generator: as
    # TorchNeuron's random-op legalization draws dropout masks outside the graph, so a compiled
    # dropout equals the eager one under one seed (Inductor's own random code draws other numbers).
    with torch._inductor.config.patch(fx_graph_cache=fx_graph_cache, fallback_random=True), \
            torch._functorch.config.patch(enable_autograd_cache=aot_cache), isa_probe.remembered_probes():
        yield


def working_directory(cache: neff_cache.NeffCache) -> str | None:
    """Inductor's working cache for ``cache`` (:meth:`~.neff_cache.NeffCache.inductor_directory`, one
    per forced capability), created 0700 and checked; None when the cache is off or none is safe."""
    base = cache.inductor_directory() if cache.enabled else None
    if base is None:
        return None
    directory = _working_dir(base)
    trusted = cache.placement.state == trust.TRUSTED
    try:
        check = trust.make_directory(directory, 0o777 if trusted else trust.PRIVATE_DIRECTORY_MODE)
    except OSError as error:
        # Said here too: with nothing of Inductor's to keep (its cache off below), nothing is
        # written later that would say it. Inductor keeps its default directory.
        cache.unwritable(error)
        return None
    if check.private or trusted:
        return directory
    warn_once(("inductor-dir", directory),
              f"torch_neuronx: not keeping Inductor's generated code in {directory}: {check.problem} "
              f"({check.describe()}), so another user could change what runs as you. Inductor uses its own "
              f"default directory instead; remove this one (neuron-cache clear) to have it made again, yours alone.")
    return None


def _user_chose_inductor_cache_dir(ours: str) -> bool:
    """Whether TORCHINDUCTOR_CACHE_DIR holds the user's choice. Inductor writes its default there
    when it first needs a directory, and this module writes ours: neither is a choice."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None:
        return False
    chosen = os.path.abspath(chosen)
    return chosen != ours and chosen not in _inductor_dirs_set and chosen != os.path.abspath(default_cache_dir())


def _cache_misses() -> int:
    """Inductor's and AOTAutograd's own cache misses and bypasses so far."""
    from torch._dynamo.utils import counters
    return sum(counters[group][name] for group, name in (
        ("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_bypass"),
        ("aot_autograd", "autograd_cache_miss"), ("aot_autograd", "autograd_cache_bypass")))


def _timed(compile_fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    return compile_fn(), time.perf_counter() - start


def compile_with_cache(key: str, compile_fn: Callable[[], Any]) -> tuple[Any, bool, float]:
    """The compiled graph for ``key``: loaded from the cache, or compiled (and stored).
    Returns (compiled, hit, seconds spent compiling or loading)."""
    cache = neff_cache.get_cache()
    if not cache.enabled:
        cache.record_compilation()
        compiled, seconds = _timed(compile_fn)
        return compiled, False, seconds
    with cache.compile_lock(key):  # processes compiling the same graph: one compiles, the rest load
        loaded = _load(cache, key, compile_fn)
        return loaded if loaded is not None else _compile_and_store(cache, key, compile_fn)


def _load(cache: neff_cache.NeffCache, key: str, compile_fn: Callable[[], Any]) -> tuple[Any, bool, float] | None:
    """The graph from its entry (None: no entry, or one that cannot be used: warned)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    payload = cache.get(key)
    if payload is None:
        return None
    try:
        start = time.perf_counter()
        artifacts, listed = libraries.unpack(payload)
        libraries.restore(cache, listed, cache_dir())  # built libraries a new working cache lacks
        torch.compiler.load_cache_artifacts(artifacts)  # Inductor's artifacts, hot-loaded
        misses = _cache_misses()
        with _backward_with_forward():
            compiled = compile_fn()  # finds everything in Inductor's caches: nothing is compiled
        return compiled, _cache_misses() == misses, time.perf_counter() - start
    except Exception as error:  # noqa: BLE001 - a bad entry must never stop a compile
        warnings.warn(f"[NEFF_CACHE] could not load compile cache entry {key} ({error!r}); recompiling",
                      RuntimeWarning, stacklevel=3)
        return None


def _backward_with_forward():
    """AOTAutograd compiles a training graph's backward with its forward, not at the first backward:
    then the entry holds both (and the libraries of both), and a new working cache (another machine)
    compiles neither. A graph that is never backpropagated pays its backward's compile once, cold."""
    return torch._functorch.config.patch(force_non_lazy_backward_lowering=True)


def _compile_and_store(cache: neff_cache.NeffCache, key: str, compile_fn: Callable[[], Any]) -> tuple[Any, bool, float]:
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from torch.compiler._cache import CacheArtifactManager

    with CacheArtifactManager.with_fresh_cache(), libraries.noting_sources() as sources, _backward_with_forward():
        compiled, seconds = _timed(compile_fn)
        # Only this graph's artifacts: with caching precompile on, saving would also write (and
        # bundle here) the packages of the functions compiled so far (:mod:`.precompile` stores those).
        with torch._dynamo.config.patch(caching_precompile=False):
            artifacts = torch.compiler.save_cache_artifacts()
    cache.record_compilation()
    if artifacts is not None:
        listed = libraries.store(cache, sources, cache_dir())
        cache.put(key, libraries.pack(artifacts[0], listed))
    return compiled, False, seconds
