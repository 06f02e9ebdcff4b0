"""Neuron work runs on the threads CPU work would run on, with the same intra-op thread count.

Autograd runs the backward of every device but CPU on a per-device thread of its own engine
(only CPU, Meta and Lazy stay on the caller's thread). For neuron, whose ops run on the host,
that thread buys nothing and costs three things:
- a hand-off to it and back at every backward;
- its OpenMP thread count, fixed when it started, drifts from CPU's after
  ``torch.set_num_threads`` (reductions split differently: other last bits);
- it may still be releasing the graph after the caller's interpreter began shutting down,
  which aborts the process at exit ("terminate called without an active exception").

So once neuron is in use, backward runs with autograd's multithreading off, i.e. on the
caller's thread, exactly as CPU's does. ``torch.set_num_threads`` is also wrapped to tell the
core, so any other thread that runs neuron ops adopts the new count.
"""
import functools

import torch
import torch.autograd
import torch.autograd.graph

from torch_neuronx.runtime import ops

_original_set_num_threads = torch.set_num_threads
_original_engine_run_backward = torch.autograd.graph._engine_run_backward


@functools.wraps(_original_set_num_threads)
def set_num_threads(count: int) -> None:
    _original_set_num_threads(count)
    ops._set_intraop_threads(torch.get_num_threads())


@functools.wraps(_original_engine_run_backward)
def _engine_run_backward(*args, **kwargs):
    if not ops._is_initialized() or not torch._C._is_multithreading_enabled():
        return _original_engine_run_backward(*args, **kwargs)
    torch._C._set_multithreading_enabled(False)
    try:
        return _original_engine_run_backward(*args, **kwargs)
    finally:
        torch._C._set_multithreading_enabled(True)


def install() -> None:
    torch.set_num_threads = set_num_threads
    ops._set_intraop_threads(torch.get_num_threads())
    # torch.autograd imported the function by name: both references are its callers'.
    torch.autograd.graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward
