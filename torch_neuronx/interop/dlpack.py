"""DLPack for neuron tensors: they are exported as host (kDLCPU) memory, without a copy.

Neuron memory here is host memory, so what a consumer reads through DLPack is the CPU view of
the same bytes: numpy, JAX on CPU or CPU torch take them zero-copy and writes go both ways. torch's
``Tensor.__dlpack_device__`` knows PrivateUse1 only by its default name ("privateuse1"), so for
"neuron" it raises; both protocol methods are wrapped for neuron tensors only (every other tensor
takes torch's own path). The capsule holds a CPU alias whose storage keeps a reference on the
neuron storage, so the bytes outlive the neuron tensor if the consumer keeps them.

Importing is torch's: a kDLCPU capsule becomes a CPU tensor on the same memory, and
``torch.from_dlpack(x, device="neuron")`` copies it into neuron memory (the allocator counts it),
as CPU to CUDA does.
"""
from __future__ import annotations

import torch
from torch.overrides import has_torch_function_unary

from torch_neuronx.runtime import BACKEND_NAME, ops

_torch_dlpack = None
_torch_dlpack_device = None


def _is_plain_neuron(tensor: torch.Tensor) -> bool:
    return tensor.device.type == BACKEND_NAME and not has_torch_function_unary(tensor)


def _dlpack(self, *args, **kwargs):
    if not _is_plain_neuron(self):
        return _torch_dlpack(self, *args, **kwargs)
    # torch's own checks first (requires_grad, conj bit, layout), with torch's messages.
    if self.requires_grad or self.is_conj() or self.layout != torch.strided:
        return _torch_dlpack(self, *args, **kwargs)
    return _torch_dlpack(ops._host_alias(self), *args, **kwargs)


def _dlpack_device(self):
    if not _is_plain_neuron(self):
        return _torch_dlpack_device(self)
    from torch.utils.dlpack import DLDeviceType

    return (DLDeviceType.kDLCPU, 0)


def install() -> None:
    """Wrap torch.Tensor.__dlpack__ and __dlpack_device__ (once)."""
    global _torch_dlpack, _torch_dlpack_device
    if _torch_dlpack is not None:
        return
    _torch_dlpack = torch.Tensor.__dlpack__
    _torch_dlpack_device = torch.Tensor.__dlpack_device__
    _dlpack.__doc__ = _torch_dlpack.__doc__
    torch.Tensor.__dlpack__ = _dlpack
    torch.Tensor.__dlpack_device__ = _dlpack_device
