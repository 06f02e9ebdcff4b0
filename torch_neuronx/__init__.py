"""torch-neuronx-cpu: TorchNeuron's ``neuron`` device, executed on the host.

After ``pip install``, ``import torch`` registers the ``neuron`` device (the
``torch.backends`` entry point calls :func:`_autoload`). With
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, ``import torch_neuronx`` does it.
"""


def _autoload():
    """Entry point of the ``torch.backends`` group, called at the end of ``import torch``.

    Defined before ``import torch`` below: if the user imports torch_neuronx first,
    torch's autoload finds this function on the partly imported module.
    """
    from torch_neuronx import _registration

    _registration.register_for_autoload()


import os as _os  # noqa: E402

import torch  # noqa: E402,F401

from torch_neuronx import _registration  # noqa: E402
from torch_neuronx.version import __version__  # noqa: E402,F401

# Under autoload (this import is torch's) a problem only warns, so `import torch`
# never fails because of us; an explicit import with autoload off fails loudly.
if _os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1":
    _registration.register_for_autoload()
else:
    _registration.register(on_conflict="raise")

is_registered = _registration.is_registered
from torch_neuronx.python_ops.trainium_semantics import eager_semantics  # noqa: E402,F401

# Trainium readiness (torch_neuronx.diagnostics): TorchNeuron's op tracking, and the report. Imported
# on first use, so that `import torch` (autoload) does not pay for it.
_DIAGNOSTICS_NAMES = ("clear_op_tracking", "get_executed_ops", "get_fallback_ops", "report")


def __getattr__(name: str):
    if name == "diagnostics" or name in _DIAGNOSTICS_NAMES:
        import importlib

        diagnostics = importlib.import_module("torch_neuronx.diagnostics")
        return diagnostics if name == "diagnostics" else getattr(diagnostics, name)
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")


if is_registered() and _os.environ.get("TORCH_NEURONX_REPORT", "").strip():
    from torch_neuronx import diagnostics as _diagnostics  # noqa: E402

    _diagnostics.enable_from_env()

# TorchNeuron's torch_neuronx.memory_* aliases: the whole torch.neuron.memory API.
from torch_neuronx.neuron.memory import *  # noqa: E402,F401,F403
