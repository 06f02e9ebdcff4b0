"""DDP under fake tensors: what DistributedDataParallel's C++ does with real values, done by shape.

DDP reads a few small CPU tensors element by element in C++ (``accessor``, ``item``), which fake
tensors, having no data, refuse ("its data is not allocated yet"). Each such place is replaced,
for a simulated rank, by the same collectives on the same shapes, so the plan lists what DDP
sends and the ranks' calls are compared as usual:

- construction: ``_verify_params_across_processes`` all_gathers each rank's parameter count
  (int64[1]) and the sizes and strides of every parameter (int64[2 x their dims]) from the
  parameters' device, then compares them; here the plan's comparison of the ranks' calls does.
- the bucket rebuild (the forward after the first backward; ``Reducer._rebuild_buckets``) writes
  the new bucket indices into CPU int32 tensors and broadcasts them from rank 0 (two broadcasts on
  the parameters' device). Here those CPU tensors are real, and a broadcast's result leaves them as
  this rank wrote them: every rank computed the same order (a rank whose backward ran in another
  order would differ in the plan anyway).
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves


def _verify_params_across_processes(process_group, tensors, logger=None) -> None:
    """DDP's check that every rank holds the same parameters: its two all_gathers, by shape."""
    device = tensors[0].device
    metadata = sum(2 * t.dim() for t in tensors)
    for numel in (1, metadata):
        sent = torch.empty(numel, dtype=torch.int64, device=device)
        dist.all_gather([torch.empty_like(sent) for _ in range(process_group.size())], sent, group=process_group)


_INTS = (torch.int32, torch.int64)
_FACTORIES = (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default, torch.ops.aten.zeros.default)


class _RealCpuInts(TorchDispatchMode):
    """The reducer's CPU int tensors are real (its C++ writes and reads them element by element, and
    pins one): they are made, and used where nothing fake takes part, for real; copying a fake result
    into one leaves it as it was."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and kwargs.get("dtype") in _INTS and torch.device(kwargs.get("device") or "cpu").type == "cpu":
            with _disable_current_modes():
                return func(*args, **kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if tensors and not any(_simulated(t) for t in tensors):
            with _disable_current_modes():
                return func(*args, **kwargs)
        if func is torch.ops.aten.copy_.default and not _simulated(args[0]) and _simulated(args[1]):
            return args[0]
        return func(*args, **kwargs)


def _simulated(t: torch.Tensor) -> bool:
    """A tensor of the simulation (fake, or one LocalTensorMode holds a value per rank in)."""
    from torch.distributed._local_tensor import LocalTensor

    return is_fake(t) or isinstance(t, LocalTensor)


class _Reducers:
    """Whether this rank made a DDP yet: only then does its backward need real CPU ints."""
    made = False


def _with_real_cpu_ints(original, makes_ddp: bool = False):
    @functools.wraps(original)
    def call(*args, **kwargs):
        if not (makes_ddp or _Reducers.made):
            return original(*args, **kwargs)
        _Reducers.made = True
        with _RealCpuInts():
            return original(*args, **kwargs)
    return call


def install(stack: contextlib.ExitStack) -> None:
    """DDP's data-reading steps replaced by their collectives, and its CPU int tensors real, until
    ``stack`` closes: in its construction, the reducer's calls from Python, and each backward."""
    import torch.distributed.utils as utils
    import torch.nn.parallel.distributed as ddp

    for module in (utils, ddp):
        saved = module._verify_param_shape_across_processes
        module._verify_param_shape_across_processes = _verify_params_across_processes
        stack.callback(setattr, module, "_verify_param_shape_across_processes", saved)
    _Reducers.made = False
    entries = [(ddp.DistributedDataParallel, "_ddp_init_helper", True),
               *((dist.Reducer, name, False) for name in ("_rebuild_buckets", "_set_static_graph",
                                                           "prepare_for_backward")),
               (torch.autograd.graph, "_engine_run_backward", False), (torch.autograd, "_engine_run_backward", False)]
    for target, name, makes_ddp in entries:
        saved = getattr(target, name)
        setattr(target, name, _with_real_cpu_ints(saved, makes_ddp))
        stack.callback(setattr, target, name, saved)
