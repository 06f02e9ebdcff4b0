"""While diagnostics observe: notice safetensors refusing device="neuron", at the caller's line.

safetensors checks the device name against its own fixed list, in Rust, before torch sees anything,
so no op reaches neuron. Its loaders are wrapped while collecting (and restored by stop()); the
wrapper only watches: the call, its result and safetensors' own error are unchanged.
"""
from __future__ import annotations

import functools
import importlib
import threading

from torch_neuronx.interop import ecosystem_errors

# (module, function, position of `device` among the positional arguments)
_LOADERS = (("safetensors.torch", "load_file", 1), ("safetensors.torch", "safe_open", 2),
            ("safetensors", "safe_open", 2))
_installed: dict[tuple[str, str], tuple[object, object]] = {}  # -> (original, wrapper)
_inside = threading.local()  # load_file calls safe_open: record the outer call only


def _wrap(original, name: str, device_at: int):
    @functools.wraps(original)
    def watched(*args, **kwargs):
        if getattr(_inside, "depth", 0):
            return original(*args, **kwargs)
        _inside.depth = 1
        try:
            return original(*args, **kwargs)
        except Exception as error:
            device = kwargs.get("device", args[device_at] if len(args) > device_at else None)
            if type(error).__name__ == "SafetensorError" and ecosystem_errors.is_neuron_device_arg(device):
                ecosystem_errors.notify("safetensors-device", f"{name}(device={device!r})", str(error))
            raise
        finally:
            _inside.depth = 0

    watched.__neuron_watched__ = original
    return watched


def install() -> None:
    """Wrap safetensors' loaders (imports safetensors if it is installed; nothing if not)."""
    for module_name, function, device_at in _LOADERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return
        current = getattr(module, function, None)
        if current is None or hasattr(current, "__neuron_watched__"):
            continue
        wrapper = _wrap(current, f"{module_name}.{function}", device_at)
        setattr(module, function, wrapper)
        _installed[(module_name, function)] = (current, wrapper)


def uninstall() -> None:
    """Put the originals back, unless someone replaced our wrappers since."""
    for (module_name, function), (original, wrapper) in list(_installed.items()):
        module = importlib.import_module(module_name)
        if getattr(module, function, None) is wrapper:
            setattr(module, function, original)
        del _installed[(module_name, function)]
