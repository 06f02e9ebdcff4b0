"""Whole compiled functions in the NEFF cache: Dynamo's caching precompile for the neuron backend.

The graph cache (:mod:`.graph_cache`) spares a new process Inductor's work, but Dynamo still
traces the Python code again. With torch's caching precompile on (``TORCH_CACHING_PRECOMPILE=1``,
or ``torch._dynamo.config.caching_precompile = True`` before ``torch.compile``), Dynamo keeps a
package per compiled function: its guards, the bytecode it generated, and one artifact per graph
from the backend. This module gives Dynamo the neuron backend's artifact (the host graph, compiled
by AOTAutograd and Inductor, serialized whole) and stores the packages in the NEFF cache, atomic,
checksummed and locked like the graphs. A new process finds a function's package when
``torch.compile`` wraps it, installs it, and runs the function without tracing it; its guards are
checked on every call as always, and a call they reject traces and compiles again.

The packages are written on the first call of each new graph (Dynamo has then recorded the
function's guards), or by ``torch.compiler.save_cache_artifacts()``. An entry that cannot be used
(corrupt, written by another version, code changed since, a guard that cannot be built again in a
new process, such as one on a closure variable of a decorated ``forward``) warns and the function
is traced, as without the package.

Torch's mode drops the guards it cannot serialize (object identity: ``ID_MATCH``, closures), in
this process too: a module attribute rebound to another function is then not seen. Hence opt-in.
Graphs the backend cannot serialize (the xla executor, tensor-subclass inputs, tensors lifted from
the graph) leave their function out of the package: it is traced in every process, as before.
"""
from __future__ import annotations

import hashlib
import importlib
import itertools
import pickle
import sys
import time
import warnings
from typing import Any, Callable

import torch
import torch._dynamo.package as dynamo_package
import torch._dynamo.precompile_context as precompile_context
from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

from torch_neuronx.neuron_dynamo_backend.caching import neff_cache
from torch_neuronx.neuron_dynamo_backend import config
from torch_neuronx.neuron_dynamo_backend import bridge
from torch_neuronx.neuron_dynamo_backend.caching import graph_cache
from torch_neuronx.neuron_dynamo_backend import metrics as graph_metrics
from torch_neuronx.version import __version__

# Bump when what a package holds, or how the backend rebuilds a graph from it, changes.
PACKAGE_FORMAT = "1"


def active() -> bool:
    """Whether Dynamo keeps packages of compiled functions (torch's switch, read when a graph compiles)."""
    return bool(torch._dynamo.config.caching_precompile)


def _restore(content: bytes) -> Callable:
    """Inductor's compiled host graph back from its serialized AOTAutograd entry."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

    with graph_cache.inductor_settings():  # Inductor's working cache (built host libraries) beside the entries
        return BundledAOTAutogradSerializableCallable.deserialize_compile_artifacts(content)


# Graphs restored while a package was checked, by the digest of their bytes: installing it uses them.
_restored: dict[str, Callable] = {}


class NeuronGraphArtifact(BackendCacheArtifact[Callable]):
    """One graph of a package: Inductor's compiled host graph, run on neuron tensors when restored."""

    def restore(self) -> None:
        digest = hashlib.sha256(self.content).hexdigest()
        if digest not in _restored:
            _restored[digest] = _restore(self.content)

    def after_deserialization(self) -> Callable:
        start = time.perf_counter()
        try:
            self.restore()
        except Exception as error:  # Dynamo falls back to tracing on a RuntimeError
            raise RuntimeError(f"could not restore neuron graph {self.key}: {error!r}") from error
        compiled = _restored.pop(hashlib.sha256(self.content).hexdigest())
        metrics = graph_metrics.new_graph(model_name=config.get_model_name(), has_collectives=False,
                                          graph_node_count=0)
        metrics.compile_us = (time.perf_counter() - start) * 1e6
        metrics.cache = "precompiled"
        return bridge.apply_device_rules(bridge.run_graph_on_neuron(compiled), config.refuse_cpu_inputs(),
                                           config.retain_device_mode())


def record_graph(backend_id: str, compiled: Any) -> bool:
    """Give Dynamo the artifact of graph ``backend_id`` (Inductor's ``compiled``) for the package of
    the function being compiled. False when the graph cannot be serialized: Dynamo then leaves the
    function out of the package."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

    if getattr(compiled, "serialize", None) is None:
        return False
    try:
        content = BundledAOTAutogradSerializableCallable.serialize_compile_artifacts(
            BundledAOTAutogradSerializableCallable(compiled))
    except Exception:  # noqa: BLE001 - not serializable: the function is traced in the next process
        return False
    PrecompileContext.record_artifact(NeuronGraphArtifact(key=backend_id, content=content))
    return True


def saving_on_first_call(call: Callable) -> Callable:
    """``call``, which stores the recorded packages once, on its first call: by then Dynamo has
    recorded the guards of the function the graph belongs to."""
    pending = [True]

    def first_call_saves(*args):
        outputs = call(*args)
        if pending:
            pending.clear()
            save_packages()
        return outputs

    return first_call_saves


def save_packages() -> None:
    """Store every package Dynamo recorded in this process (each whole, replacing its older entry)."""
    entries, _ = PrecompileContext.create_cache_entries()
    for source_id, entry in entries.items():
        try:
            STORE.write(entry, source_id)
        except Exception as error:  # noqa: BLE001 - storing is never a failure of the compile
            warnings.warn(f"torch_neuronx: could not store compiled function {entry.dynamo.fn_name} in the "
                          f"compile cache ({error!r}); a new process will trace it again", RuntimeWarning,
                          stacklevel=2)


def _entry_key(source_id: str) -> str:
    return neff_cache.cache_key("dynamo-package", source_id, sys.version, torch.__version__, __version__,
                                PACKAGE_FORMAT)


def _check_module(entry, fn: Callable[..., Any]) -> None:
    """The package was traced in the module ``fn`` lives in now. A script run as ``__main__`` and the
    same file imported by name are two modules: the generated code installed into the other one
    would lack the globals it names, and checking its sources would import the script again."""
    from torch._dynamo.eval_frame import innermost_fn

    module = getattr(innermost_fn(fn), "__module__", None)
    for code in entry.dynamo.codes:
        if code.python_module != module:
            raise RuntimeError(f"it was compiled in module {code.python_module!r}, and the function is now in "
                               f"{module!r}")


def _check_sources(entry) -> None:
    """Dynamo's own check (it raises when installing): the code traced into the package is unchanged."""
    for code in entry.dynamo.source_info.inlined_sources:
        module = importlib.import_module(code.module)
        if dynamo_package._hash_sourcelines(module, code.firstlineno, code.lastlineno) != code.checksum:
            raise RuntimeError(f"the source of {code.module} (lines {code.firstlineno}-{code.lastlineno}) changed")


def _check_guards(entry, fn: Callable[..., Any]) -> None:
    """Build each guard of the package as installing it will, in this process: some guards Dynamo
    saves cannot be built anew (they read a value that only the traced call had), and installing
    raises then, which would stop ``torch.compile``."""
    from torch._dynamo.eval_frame import innermost_fn
    from torch._dynamo.output_graph import get_builtins_dict

    for index, code in enumerate(entry.dynamo.codes):
        if code.bypassed or not code.guarded_codes:
            continue
        target = innermost_fn(fn).__code__ if index == 0 else \
            dynamo_package.SerializedCode.to_code_object(code.python_code)
        if code.code_source:
            target = dynamo_package._lookup_code(code)
        scope = dict(sys.modules[code.python_module].__dict__)
        for guarded in code.guarded_codes:
            state = dynamo_package.load_guards_state(guarded.guards_state)
            name = state.output_graph.name_of_builtins_dict_key_in_fglobals
            if name and name not in scope:
                scope[name] = get_builtins_dict(scope)
            dynamo_package.load_guard_manager(state, target, scope)


def _reserve_global_names(entry) -> None:
    """Installing a package puts globals named by Dynamo's counter in the other process (its builtins
    dict, ``__builtins_dict___0``) into the function's module; move this process's counter past them,
    so that tracing the function again (a guard failed) does not pick the same name."""
    from torch._dynamo import bytecode_transformation

    numbers = [0]
    for code in entry.dynamo.codes:
        for guarded in code.guarded_codes:
            name = dynamo_package.load_guards_state(guarded.guards_state).output_graph \
                .name_of_builtins_dict_key_in_fglobals
            if name and name.rpartition("_")[2].isdigit():
                numbers.append(int(name.rpartition("_")[2]) + 1)
    start = max(max(numbers), next(bytecode_transformation._unique_id_counter))
    bytecode_transformation._unique_id_counter = itertools.count(start)


class NeffDynamoCache(dynamo_package.DiskDynamoCache):
    """Dynamo's store of packages, kept in the NEFF cache: one entry per compiled function, keyed by
    the function (Dynamo's source id: qualified name and first line) and the versions."""

    def __init__(self) -> None:
        super().__init__("")

    def path_prefix(self) -> str:
        return neff_cache.get_cache().directory

    def clear(self) -> None:
        pass  # the entries go with the NEFF cache's (neuron-cache clear)

    def _write_to_local_cache(self, pickled_content: bytes, path: str) -> None:
        cache, key = neff_cache.get_cache(), _entry_key(path)
        with cache.compile_lock(key):
            cache.put(key, pickled_content)

    def read(self, path: str):
        payload = neff_cache.get_cache().get(_entry_key(path))
        if payload is None:
            raise RuntimeError(f"no compiled function {path} in the compile cache")
        return pickle.loads(payload)

    def load(self, fn: Callable[..., Any]):
        """The package of ``fn``, checked so that installing it cannot fail; None (warned) when it cannot be used."""
        from torch._dynamo.utils import counters

        cache = neff_cache.get_cache()
        if not cache.enabled:
            return None
        source_id = dynamo_package.CompilePackage.source_id_from_fn(fn)
        payload = cache.get(_entry_key(source_id))  # a corrupt entry warns, is removed and reads as absent
        if payload is None:
            counters["dynamo_cache"]["dynamo_cache_miss"] += 1
            return None
        try:
            entry = pickle.loads(payload)
            if not isinstance(entry, dynamo_package.PrecompileCacheEntry):
                raise RuntimeError(f"not a compiled function but {type(entry).__name__}")
            entry.dynamo.check_versions()
            _check_module(entry, fn)
            _check_sources(entry)
            _check_guards(entry, fn)
            _reserve_global_names(entry)
            for backend in entry.backends.values():
                if isinstance(backend, NeuronGraphArtifact):
                    backend.restore()
            for backend in entry.backends.values():
                PrecompileContext.record_artifact(backend)
        except Exception as error:  # noqa: BLE001 - a bad entry must never stop a compile
            counters["dynamo_cache"]["dynamo_cache_error"] += 1
            warnings.warn(f"torch_neuronx: could not use compiled function {getattr(fn, '__qualname__', fn)} from "
                          f"the compile cache ({type(error).__name__}: {error}); tracing it again", RuntimeWarning,
                          stacklevel=2)
            return None
        counters["dynamo_cache"]["dynamo_cache_hit"] += 1
        return entry


STORE = NeffDynamoCache()
# Dynamo looks its store up by these names when it loads and saves packages.
dynamo_package.DynamoCache = STORE
precompile_context.DynamoCache = STORE
