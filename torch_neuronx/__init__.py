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
import sys as _sys  # noqa: E402

import torch  # noqa: E402,F401

from torch_neuronx import utils  # noqa: E402
from torch_neuronx.version import __version__  # noqa: E402,F401

utils.set_env_defaults()  # TorchNeuron's defaults (NEURON_LAUNCH_BLOCKING=0, ...), before anything reads them

from torch_neuronx import _registration  # noqa: E402

# Under autoload (this import is torch's) a problem only warns, so `import torch`
# never fails because of us; an explicit import with autoload off fails loudly.
if _os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1":
    _registration.register_for_autoload()
else:
    _registration.register(on_conflict="raise")

is_registered = _registration.is_registered
from torch_neuronx.python_ops.trainium_semantics import eager_semantics  # noqa: E402,F401

# Trainium readiness (torch_neuronx.diagnostics): TorchNeuron's op tracking, and the report; and the
# compiler's metrics. Imported on first use, so that `import torch` (autoload) does not pay for them.
_LAZY_NAMES = {**dict.fromkeys(("clear_op_tracking", "get_executed_ops", "get_fallback_ops", "report"),
                               "torch_neuronx.diagnostics"),
               **dict.fromkeys(("get_dynamo_metrics", "reset_dynamo_metrics"), "torch_neuronx.neuron_dynamo_backend")}


def __getattr__(name: str):
    if name == "diagnostics" or name in _LAZY_NAMES:
        import importlib

        module = importlib.import_module(_LAZY_NAMES.get(name, "torch_neuronx.diagnostics"))
        return module if name == "diagnostics" else getattr(module, name)
    if name == "_C":
        raise AttributeError("module 'torch_neuronx' has no attribute '_C': TorchNeuron's compiled internals are not "
                             "part of torch-neuronx-cpu. Use the public API (torch_neuronx.device_count(), torch.neuron.*, "
                             "torch_neuronx.memory_stats(), ...).")
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")


if is_registered() and _os.environ.get("TORCH_NEURONX_REPORT", "").strip():
    from torch_neuronx import diagnostics as _diagnostics  # noqa: E402

    _diagnostics.enable_from_env()

# TorchNeuron's device API at the package's top (its torch_neuronx/__init__.py): the same functions as
# torch.neuron's, except set_device, which takes an index (torch.neuron.set_device calls it).
from torch_neuronx.neuron.memory import *  # noqa: E402,F401,F403
from torch_neuronx.neuron import (  # noqa: E402,F401
    Event,
    Stream,
    StreamContext,
    _lazy_init,
    current_device,
    current_stream,
    default_stream,
    device,
    device_count,
    get_device_properties,
    set_stream,
    stream,
    synchronize,
)
from torch_neuronx.neuron import is_initialized as is_neuron_runtime_initialized  # noqa: E402,F401
from torch_neuronx.neuron import memory, streams  # noqa: E402,F401
from torch_neuronx.neuron._device import set_device  # noqa: E402,F401

# TorchNeuron's module paths: `from torch_neuronx.memory import ...`, `torch_neuronx.streams.Stream`.
_sys.modules.setdefault(f"{__name__}.memory", memory)
_sys.modules.setdefault(f"{__name__}.streams", streams)
