"""aten kernels of the neuron device written in Python (TorchNeuron's name for its own: ``python_ops``).

Every other op runs PyTorch's CPU kernel through the C++ core; these are the ops whose CPU kernel
the neuron device cannot reach. :func:`install` registers them all.

- :mod:`.recurrent`: RNN, GRU and LSTM through CPU's generic path (PyTorch sends non-CPU devices to
  fused cells that CPU has no kernel for).
"""
from torch_neuronx.python_ops import recurrent


def install() -> None:
    recurrent.install()
