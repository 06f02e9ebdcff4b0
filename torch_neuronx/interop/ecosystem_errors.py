"""Where other libraries meet neuron and fail as they would on Trainium: the clear errors we raise,
and the working paths we name.

- Inductor (``torch.compile``'s default backend) has no code generator for neuron tensors, on
  Trainium as here: TorchNeuron registers none. Inductor asks the device module (``torch.neuron``)
  for one (``Scheduling``, ``PythonWrapperCodegen``, ... read by its ``init_backend_registration``);
  ours is :data:`NO_INDUCTOR_BACKEND`, which raises :class:`InductorOnNeuronError` at Inductor's
  first question about a neuron graph, before it lowers anything.
- safetensors accepts a fixed list of device names (cpu, cuda, mps, npu, xpu, xla, mlu, hpu, musa)
  or a bare index; ``device="neuron"`` fails inside safetensors with ``device neuron is invalid``,
  on Trainium too. :data:`SAFETENSORS_FIX` names the working paths.

Diagnostics listen here (:func:`listen`) to put these in the readiness report. :func:`install`
gives ``torch.neuron`` the Inductor hooks that raise.
"""
from __future__ import annotations

from typing import Callable

from torch_neuronx.runtime import BACKEND_NAME

INDUCTOR_FIX = (
    'compile with backend="neuron" (torch.compile(model, backend="neuron"), model.compile(backend="neuron"), '
    'or compile_repeated_blocks(backend="neuron")), or run the model on CPU for Inductor')

SAFETENSORS_FIX = (
    'safetensors knows no "neuron" device (its device list is fixed: the same on Trainium). '
    'Load to CPU and move: load_file(path, device="cpu") then .to("neuron"); or pass the bare '
    'device index, load_file(path, device=torch.neuron.current_device()), which torch resolves to that '
    'neuron device (0 outside torchrun; under torchrun the local rank, each process\'s own core)')

# (kind, what was called, detail) -> None; called where the error happens, on the user's stack.
_listeners: list[Callable[[str, str, str], None]] = []


def listen(listener: Callable[[str, str, str], None]) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def notify(kind: str, call: str, detail: str) -> None:
    for listener in list(_listeners):
        listener(kind, call, detail)


class InductorOnNeuronError(RuntimeError):
    """torch.compile's default backend (Inductor) was given neuron tensors."""


def _inductor_on_neuron(asked: str):
    notify("inductor-on-neuron", 'torch.compile(backend="inductor")',
           f"a graph on neuron tensors reached Inductor (it asked for neuron's {asked})")
    return InductorOnNeuronError(
        "torch.compile's default backend, Inductor, cannot compile a graph on neuron tensors: neuron has "
        f"no Inductor code generator, on Trainium either (TorchNeuron registers none). Fix: {INDUCTOR_FIX}.")


class _NoInductorBackend:
    """Stands for every Inductor code generator class of neuron: any use raises the clear error."""

    def __init__(self, role: str) -> None:
        self._role = role

    def __call__(self, *args, **kwargs):
        raise _inductor_on_neuron(self._role)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _inductor_on_neuron(f"{self._role}.{name}")

    def __repr__(self) -> str:
        return f"<neuron has no Inductor {self._role}: use backend=\"neuron\">"


# The names Inductor's init_backend_registration reads from a PrivateUse1 device module.
INDUCTOR_HOOK_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")
NO_INDUCTOR_BACKEND = {name: _NoInductorBackend(name) for name in INDUCTOR_HOOK_NAMES}


def is_neuron_device_arg(device) -> bool:
    """Whether a safetensors ``device`` argument names neuron by its name (which safetensors rejects)."""
    text = device.type if hasattr(device, "type") and not isinstance(device, str) else device
    return isinstance(text, str) and text.split(":", 1)[0] in (BACKEND_NAME, "privateuseone")


def install() -> None:
    """``torch.neuron`` answers Inductor's questions for a device's code generators with
    :data:`NO_INDUCTOR_BACKEND`: one clear error naming backend="neuron" at its first use of a neuron graph."""
    from torch_neuronx import neuron

    for name, hook in NO_INDUCTOR_BACKEND.items():
        setattr(neuron, name, hook)
