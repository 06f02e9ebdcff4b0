"""The runtime layer, under everything else in torch_neuronx.

It holds what every other part needs and may import:
- the backend's name and the core's ops, the emulated topology applied to the core and torchrun's
  device numbering (:mod:`.core`);
- the table of Trainium chips and instances (:mod:`.hardware`) and the emulated instance read from
  the environment (:mod:`.topology`), with ``neuron-ls`` over them (:mod:`.cli`);
- the host's free memory and disk, and the refusal before a job that cannot fit (:mod:`.host_memory`);
- the one parser of boolean environment variables (:mod:`.env`), the one byte formatter
  (:mod:`.units`), warnings given once per process (:mod:`.warn`), result files written whole
  (:mod:`.outputs`), the one walker to the user's frame (:mod:`.frames`) and the slot through which
  diagnostics observe the compiler (:mod:`.hooks`).
Its modules import only torch, the standard library and each other; nothing here imports a higher layer.
"""
from torch_neuronx.runtime.core import BACKEND_NAME, apply_topology, bind_devices, load_core, ops
from torch_neuronx.runtime.env import env_flag, env_number
from torch_neuronx.runtime.units import format_bytes
from torch_neuronx.runtime.warn import warn_once

__all__ = ["BACKEND_NAME", "apply_topology", "bind_devices", "env_flag", "env_number", "format_bytes", "load_core", "ops",
           "warn_once"]
