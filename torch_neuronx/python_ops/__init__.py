"""aten kernels of the neuron device written in Python (TorchNeuron's name for its own: ``python_ops``).

Every other op runs PyTorch's CPU kernel through the C++ core; these are the ops whose CPU kernel
the neuron device cannot reach. :func:`install` registers them all.

- :mod:`.linear_backward`: ``aten::linear_backward``, which PyTorch has for MKLDNN tensors only, as
  TorchNeuron computes it.
- :mod:`.multi_head_attention`: ``aten::_native_multi_head_attention`` (nn.MultiheadAttention's inference
  fast path) with TorchNeuron's rules: no mask tensor, no attention weights, ``mask_type=1`` causal.
- :mod:`.recurrent`: RNN, GRU and LSTM through CPU's generic path (PyTorch sends non-CPU devices to
  fused cells that CPU has no kernel for).
- :mod:`.sync_batch_norm`: the kernels ``nn.SyncBatchNorm`` calls, which PyTorch has for CUDA only
  (``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt`` and the two
  backward ones), computed as TorchNeuron computes them.
- :mod:`.trainium_semantics`: with ``TORCH_NEURONX_EAGER_SEMANTICS=trainium``, every eager op computes
  as TorchNeuron's does; :mod:`.host_ops` lists the ops TorchNeuron runs on the CPU.
- :mod:`.torchneuron_kernels`: the ops TorchNeuron has kernels for; the composites among them are
  tracked under their own name (``csrc/named_ops.cpp``).
"""
from torch_neuronx.python_ops import (linear_backward, multi_head_attention, recurrent, sync_batch_norm,
                                      torchneuron_kernels, trainium_semantics)
from torch_neuronx.runtime import ops


def install() -> None:
    linear_backward.install()
    multi_head_attention.install()
    recurrent.install()
    sync_batch_norm.install()
    trainium_semantics.install()
    # last: the ops registered above have a neuron kernel already, so they are not composites here
    ops._register_named_ops(list(torchneuron_kernels.named_composites()))
