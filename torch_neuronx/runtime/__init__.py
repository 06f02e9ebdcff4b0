"""The runtime layer, under everything else in torch_neuronx.

It holds what every other part needs and may import: the backend's name and the core's ops
(:mod:`.core`), the emulated topology applied to the core and torchrun's device numbering (:mod:`.core`), the one parser of
boolean environment variables (:mod:`.env`), the one byte formatter (:mod:`.units`), warnings
given once per process (:mod:`.warn`), the one walker to the user's frame (:mod:`.frames`) and the slot through which diagnostics observe the
compiler (:mod:`.hooks`). It imports only torch, the standard library and
:mod:`torch_neuronx.runtime.topology`; nothing here imports a higher layer.
"""
from torch_neuronx.runtime.core import BACKEND_NAME, apply_topology, bind_devices, load_core, ops
from torch_neuronx.runtime.env import env_flag, env_number
from torch_neuronx.runtime.units import format_bytes
from torch_neuronx.runtime.warn import warn_once

__all__ = ["BACKEND_NAME", "apply_topology", "bind_devices", "env_flag", "env_number", "format_bytes", "load_core", "ops",
           "warn_once"]
