"""The process group a simulated rank gets from ``init_process_group``: torch's fake group (no
communication), whose every collective's Work holds its result, as Gloo's and NCCL's do.

torch's FakeWork (and LocalTensorMode's) completes with None. DDP's reducer reads the result of
each bucket's all_reduce from the Work's future (``parseCppCommHookResult`` insists on a tensor),
and so do comm hooks (``fp16_compress_hook``: ``fut.value()[0]``). So the group is a Python
``ProcessGroup`` over the fake backend whose methods run the call as the C++ group would (it still
reaches the dispatcher, where the recorder and LocalTensorMode see it, with this group) and hand
back a Work completed with the call's output tensors. No Gloo here, so calling the C++ base from
the override, with the GIL held, is safe (distributed/collective_checks.py explains why the real
group cannot).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FakeProcessGroup, _create_work_from_future

from torch_neuronx.runtime import BACKEND_NAME

NAME = "neuron_plan"
PG = dist.ProcessGroup
# The collectives torch calls on a group from Python, or from C++ through the methods it lets Python
# override (PyProcessGroup.hpp); every argument before the options is an output (or in place).
COLLECTIVES = ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "allgather_coalesced",
               "_allgather_base", "all_gather_single", "all_gather_single_coalesced", "reduce_scatter",
               "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_single_coalesced", "alltoall",
               "alltoall_base", "all_to_all_single", "gather", "scatter", "barrier", "send", "recv")


def _outputs(args) -> list[torch.Tensor]:
    """The output tensors of a call: its first argument, flattened (a tensor, a list, a list of lists)."""
    first = args[0] if args else []
    if isinstance(first, torch.Tensor):
        return [first]
    if not isinstance(first, (list, tuple)):
        return []
    return [t for x in first for t in (x if isinstance(x, (list, tuple)) else [x]) if isinstance(t, torch.Tensor)]


def _completed(name: str):
    base = getattr(PG, name)

    def method(self, *args, **kwargs):
        base(self, *args, **kwargs)
        future = torch.futures.Future()
        future.set_result(_outputs(args) if name != "barrier" else [])
        return _create_work_from_future(future)

    # pybind's trampoline runs the C++ base, not this override again, when the calling frame is a
    # method of that name on this object: the code must carry the name.
    method.__name__ = name
    method.__code__ = method.__code__.replace(co_name=name)
    return method


class PlannedGroup(PG):
    """The fake group of one simulated rank, its Works completed with their results."""

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)
        fake = FakeProcessGroup._create_internal(rank, size, FakeProcessGroup.Options())
        for device in ("cpu", BACKEND_NAME):
            self._register_backend(torch.device(device), PG.BackendType.CUSTOM, fake)
        self._set_default_backend(PG.BackendType.CUSTOM)

    def getBackendName(self):
        return NAME

    def name(self):
        return NAME


for _name in COLLECTIVES:
    setattr(PlannedGroup, _name, _completed(_name))


def _create(store, rank: int, size: int, timeout):
    return PlannedGroup(rank, size)


def register() -> None:
    """Make ``init_process_group(NAME)`` give a PlannedGroup (idempotent)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["cpu", BACKEND_NAME])
