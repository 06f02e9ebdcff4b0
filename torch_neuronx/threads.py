"""Keeps neuron's intra-op thread count equal to CPU's.

Autograd runs the backward of neuron tensors on its own neuron device thread, whose
OpenMP thread count was fixed when that thread started, while CPU's backward runs on
the caller's thread. A later ``torch.set_num_threads(n)`` would then reach CPU's
backward but not neuron's, and reductions would split differently (other last bits,
other speed). ``torch.set_num_threads`` is wrapped to tell the core, which makes every
thread that runs a neuron op adopt the new count.
"""
import functools

import torch

_original_set_num_threads = torch.set_num_threads


@functools.wraps(_original_set_num_threads)
def set_num_threads(count: int) -> None:
    _original_set_num_threads(count)
    torch.ops.neuron._set_intraop_threads(torch.get_num_threads())


def install() -> None:
    torch.set_num_threads = set_num_threads
    torch.ops.neuron._set_intraop_threads(torch.get_num_threads())
