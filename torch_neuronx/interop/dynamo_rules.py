"""Dynamo never traces torch_neuronx's own Python, as it never traces torch's.

After a graph break, Dynamo compiles every Python frame it meets that its rules do not skip: the
backward wrapper of :mod:`.threads`, the compiler's own functions run at the first backward call,
the diagnostics. Traced, they cost compile time and break at any change. So the whole package is
added to Dynamo's skipped directories, once, when Dynamo is imported (``import torch`` does not
import it, and must not pay for it).

A call from compiled code into a skipped function is a graph break, then runs eagerly, exactly as
for most of ``torch.cuda`` (memory queries, ``manual_seed``, streams). The queries Dynamo folds to
constants for ``torch.cuda`` fold the same way for ``torch.neuron`` (:data:`FOLDED`; those that can
change during a run get a guard, :data:`FOLDED_WITH_GUARDS`), so they keep a graph whole; device
properties are an immutable constant, as ``torch.cuda``'s are.
"""
from __future__ import annotations

import importlib.abc
import sys

from torch_neuronx import neuron

PACKAGE = __name__.split(".")[0]
# As torch.cuda.is_available, device_count, get_device_properties, ... (constant_fold_functions).
FOLDED = ("is_available", "device_count", "get_device_properties", "get_device_name", "get_device_capability",
          "is_bf16_supported")
# As torch.cuda.current_device and is_initialized (constant_fold_functions_need_guards).
FOLDED_WITH_GUARDS = ("current_device", "is_initialized")
_DYNAMO = "torch._dynamo"


def _apply() -> None:
    from torch._dynamo import trace_rules, utils
    from torch._dynamo.variables import torch as torch_variables

    trace_rules.add(PACKAGE)
    utils.common_constant_types.add(neuron.properties.NeuronDeviceProperties)  # as torch.cuda._CudaDeviceProperties
    rules = trace_rules.get_torch_obj_rule_map()
    for name in FOLDED + FOLDED_WITH_GUARDS:
        function = getattr(neuron, name)
        rules[function] = torch_variables.TorchInGraphFunctionVariable
        torch_variables.constant_fold_functions[function] = None
        if name in FOLDED_WITH_GUARDS:
            torch_variables.constant_fold_functions_need_guards[function] = None


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` with the other finders, and applies the rules once it has run."""

    def find_spec(self, name, path, target=None):
        if name != _DYNAMO:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        run_module = spec.loader.exec_module

        def run_then_apply(module):
            run_module(module)
            _apply()

        spec.loader.exec_module = run_then_apply
        return spec


def install() -> None:
    if _DYNAMO in sys.modules:
        _apply()
    elif not any(isinstance(finder, _AfterDynamoImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamoImport())
