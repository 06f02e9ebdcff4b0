"""``--numerics``: the program with real values for every rank in one process, against one device.

The program runs once under ``LocalTensorMode`` (torch.distributed._local_tensor): every tensor
holds one value per rank, every op runs for each rank, and collectives combine the ranks' values
as the real ones would (on torch's fake process group, which moves nothing). The program then
runs again as a single rank on one device (WORLD_SIZE=1), with plain tensors. Each top-level
tensor of the program present in both runs (or those named by ``--outputs``) is compared, for
every rank: a DTensor as its full tensor, a LocalTensor as each rank's value, at float32's
tolerance (torch.testing's default: rtol 1.3e-6, atol 1e-5; wider dtypes keep their own).

Assumes SPMD: under LocalTensorMode ``dist.get_rank()`` is 0 for the single run that stands for
all ranks, so a program whose control flow depends on its rank needs the structure mode (which
runs each rank's own code).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from torch_neuronx.simulate import render
from torch_neuronx.simulate.rows import Numerics, OutputRow

RTOL, ATOL = 1.3e-6, 1e-5
SHOWN_VALUES = 64  # outputs this small are written out whole, every rank's and one device's


def _per_rank(value, ranks: int) -> list[torch.Tensor] | None:
    """The value each rank holds, on the CPU, or None for what is not a tensor."""
    from torch.distributed._local_tensor import LocalTensor
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.full_tensor()
    if isinstance(value, LocalTensor):
        return [value._local_tensors[r].detach().cpu() for r in range(ranks)]
    if isinstance(value, torch.Tensor):
        return [value.detach().cpu()] * ranks
    return None


def _tensors(namespace: dict, ranks: int, names) -> dict[str, list[torch.Tensor]]:
    found = {}
    for name, value in namespace.items():
        if name.startswith("__") or (names and name not in names):
            continue
        values = _per_rank(value, ranks)
        if values is not None:
            found[name] = values
    return found


@contextlib.contextmanager
def _fsdp_keeps_local_storages():
    """FSDP2 frees an unsharded parameter by resizing its storage to 0 and re-allocates it before
    the next all-gather; a LocalTensor has no storage of its own to resize (torch raises "invalid
    python storage"). Under --numerics memory is not measured, so the storage simply stays."""
    from torch.distributed._local_tensor import LocalTensor
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    def keep_local(original):
        def call(tensor):
            if not isinstance(tensor, LocalTensor):
                original(tensor)
        return call

    saved = {(m, n): getattr(m, n) for m in (_fsdp_param, _fsdp_param_group)
             for n in ("alloc_storage", "free_storage") if hasattr(m, n)}
    for (module, name), original in saved.items():
        setattr(module, name, keep_local(original))
    try:
        yield
    finally:
        for (module, name), original in saved.items():
            setattr(module, name, original)


@contextlib.contextmanager
def _groups_kept_until_compared():
    """The program's ``destroy_process_group()`` waits until its DTensors have been compared:
    ``full_tensor()`` all-gathers over their mesh's groups. simulated_rank destroys them after."""
    import torch.distributed as dist

    def destroy_later(group=None):
        if group is not None:
            original(group)

    original = dist.destroy_process_group
    dist.destroy_process_group = dist.distributed_c10d.destroy_process_group = destroy_later
    try:
        yield
    finally:
        dist.destroy_process_group = dist.distributed_c10d.destroy_process_group = original


@contextlib.contextmanager
def _ranks_of_every_rank(size: int):
    """``dist.get_rank()`` of the default group is each rank's own, as LocalTensorMode holds ints
    (a SymInt of one value per rank, as its DeviceMesh.get_rank gives): a rank's slice of a batch
    (``x[rank * n:(rank + 1) * n]``) is then each rank's own slice."""
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalIntNode

    original = dist.get_rank

    def get_rank(group=None):
        if group is not None and group is not dist.group.WORLD:
            return original(group)
        return torch.SymInt(LocalIntNode({r: r for r in range(size)}))

    dist.get_rank = dist.distributed_c10d.get_rank = get_rank
    try:
        yield
    finally:
        dist.get_rank = dist.distributed_c10d.get_rank = original


@dataclasses.dataclass
class NumericsPlan(render.PlanFiles):
    """A numerics plan (``--numerics``): each compared output's worst difference and rank.
    Its files as :class:`.render.PlanFiles` writes them."""

    script: str
    args: list
    instance: str
    lnc: int
    nnodes: int
    nproc_per_node: int
    world_size: int
    numerics: Numerics
    schema: int = 1
    mode: str = "numerics"

    nested = {"numerics": Numerics.from_dict}


def _compared(per_rank: list, ref: torch.Tensor) -> OutputRow:
    """One output's comparison: every rank's value against one device's, and the worst rank."""
    worst, worst_rank, good = 0.0, 0, True
    for rank, got in enumerate(per_rank):
        if got.shape != ref.shape:
            good, worst_rank, worst = False, rank, float("inf")
            break
        diff = (got.double() - ref.double()).abs().max().item() if got.numel() else 0.0
        try:
            torch.testing.assert_close(got, ref, rtol=RTOL, atol=ATOL) if got.dtype == torch.float32 else \
                torch.testing.assert_close(got, ref)
        except AssertionError:
            good = False
        if diff >= worst:
            worst, worst_rank = diff, rank
    shown = ref.numel() <= SHOWN_VALUES  # a loss curve, say: what a torchrun run would log, rank by rank
    return OutputRow(list(ref.shape), str(ref.dtype).removeprefix("torch."), worst, worst_rank, good,
                     values=[got.tolist() for got in per_rank] if shown else None,
                     one_device=ref.tolist() if shown else None)


def run(script: str, argv, instance, nnodes: int, nproc_per_node: int, lnc: int, names=None) -> NumericsPlan:
    from torch.distributed._local_tensor import LocalTensorMode

    from torch_neuronx.simulate import world

    world.prepare_process(instance.name, lnc)
    size = nnodes * nproc_per_node
    start = time.perf_counter()
    # One run for all ranks: the fake group's rank 0 stands for each, LocalTensorMode holds their values.
    with world.simulated_rank(0, size, nproc_per_node, script, list(argv)):
        with _groups_kept_until_compared(), _fsdp_keeps_local_storages(), LocalTensorMode(size), \
                _ranks_of_every_rank(size):
            namespace = world.run_script_keeping_globals(script)
            simulated = _tensors(namespace, size, names)
        del namespace
    with world.simulated_rank(0, 1, 1, script, list(argv)):
        reference = {name: values[0] for name, values in _tensors(world.run_script_keeping_globals(script), 1,
                                                                   names).items()}
    compared = sorted(set(simulated) & set(reference))
    missing = sorted(set(names or ()) - set(compared))
    outputs = {name: _compared(simulated[name], reference[name]) for name in compared}
    ok = all(output.ok for output in outputs.values())
    if not compared or missing:
        ok = False
    layout = f"{nnodes} x {instance.name}"
    return NumericsPlan(
        script=script, args=list(argv), instance=instance.name, lnc=lnc, nnodes=nnodes,
        nproc_per_node=nproc_per_node, world_size=size,
        numerics=Numerics(ok, outputs, missing, layout,
                          f"float32: rtol {RTOL}, atol {ATOL}; other dtypes: torch.testing's defaults",
                          time.perf_counter() - start))
