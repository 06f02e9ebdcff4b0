"""Check a torchrun program's plan for N x M ranks in one process, before renting the instances.

``python -m torch_neuronx.simulate --nproc-per-node 64 --instance trn2.48xlarge train.py ARGS``
runs the unchanged program once per rank, under torch's FakeTensorMode (no data, full size) on
torch's ``fake`` process group (no communication) standing in for ``neuron``. Each run records
that rank's neuron memory and collectives (:mod:`.recorder`); the plan (:mod:`.plan`) compares
every rank's peak with its core's HBM, estimates the collectives' time on the instance's links and
fails when the members of a process group disagree on their calls. ``--numerics`` runs it once
under ``LocalTensorMode`` (torch.distributed._local_tensor: every rank's real values in one
process) and compares the program's top-level tensors with one device's (:mod:`.numerics`).

Why one run per rank, and not one run for all: a program may branch on its rank (``if rank == 0``),
and only running that rank's code shows what it does. Fake tensors make a run cheap: no data is
allocated, each op only computes shapes.
"""
from __future__ import annotations

import gc
import os
import time

from torch_neuronx.runtime import hardware

DEFAULT_OUT = "neuron_plan"


class PlanError(ValueError):
    """Bad input: names the problem and the fix."""


def resolve(instance: str, nnodes: int | None, nproc_per_node: int, lnc: int | None):
    """(Instance, nodes, LNC) for the command line's choice; raises PlanError naming the fix.

    ``instance`` is an instance type of the table (trn2.48xlarge), ``Nx`` one (``2xtrn2.48xlarge``,
    the same as ``--nnodes 2``) or an UltraServer (``trn3-gen1-ultraserver``: its servers are the
    nodes)."""
    name = instance.strip().replace(" ", "")
    count = None
    head, sep, tail = name.partition("x")
    if sep and head.isdigit() and tail in hardware.INSTANCES:
        count, name = int(head), tail
    if name in hardware.SYSTEMS:
        name, count = hardware.SYSTEMS[name]
    if name not in hardware.INSTANCES:
        known = ", ".join([*hardware.INSTANCES, *hardware.SYSTEMS])
        raise PlanError(f"unknown instance {instance!r}: use one of {known}, or 'Nx' before an instance type "
                        f"(2xtrn2.48xlarge) for N of them")
    if count is not None and nnodes is not None and nnodes != count:
        raise PlanError(f"--instance {instance} means {count} nodes but --nnodes is {nnodes}: give only one of them")
    nodes = count or nnodes or 1
    if nodes < 1 or nproc_per_node < 1:
        raise PlanError("--nnodes and --nproc-per-node must be at least 1")
    inst = hardware.INSTANCES[name]
    valid = inst.chip.lnc_values
    lnc = valid[0] if lnc is None else lnc
    if lnc not in valid:
        raise PlanError(f"--lnc {lnc} is not valid on {name}: use {' or '.join(map(str, valid))}")
    cores = inst.logical_cores(lnc)
    if nproc_per_node > cores:
        raise PlanError(f"--nproc-per-node {nproc_per_node} is more than the {cores} logical NeuronCores of {name} "
                        f"at LNC={lnc} (one rank per core): use --nproc-per-node {cores} or fewer, more nodes "
                        f"(--nnodes), LNC=1 (--lnc 1) or a larger instance")
    us = inst.links.ultraserver_nodes if inst.links else 1
    if us > 1 and nodes > us:
        raise PlanError(f"{name} is a server of an UltraServer of {us}; {nodes} nodes would span UltraServers, "
                        f"which this model does not describe: use at most {us}")
    return inst, nodes, lnc


def structure(script: str, argv, instance: hardware.Instance, nnodes: int, nproc_per_node: int, lnc: int,
              progress=None) -> dict:
    """Run the program once per rank under fake tensors; the plan (a dict, see :mod:`.plan`).

    Each rank runs in a forked child of this process: it starts from the same warm state (torch and
    the program's imports loaded once, here) and leaves nothing behind for the next rank. DTensor,
    DeviceMesh and FSDP keep process-wide caches keyed by meshes that compare equal across ranks;
    a second rank run in the same process would be handed the first one's process groups."""
    from torch_neuronx.simulate import plan, world

    world.prepare_process(instance.name, lnc)
    _preimport(script)
    capacity = instance.chip.core_memory(lnc)
    size = nnodes * nproc_per_node
    records = []
    start = time.perf_counter()
    gc.collect()
    gc.freeze()  # the children share these pages; their collections skip them
    for rank in range(size):
        records.append(_run_rank_in_child(rank, size, nproc_per_node, capacity, script, list(argv)))
        if progress:
            progress(rank, records[-1])
        if records[-1].error:
            break
    gc.unfreeze()
    layout = plan.Layout(instance, lnc, nnodes, nproc_per_node)
    return plan.build(records, layout, capacity, script, argv, time.perf_counter() - start, len(records))


def _preimport(script: str) -> None:
    """Import the program's top-level imports once, so that each rank's child finds them loaded."""
    import ast
    import importlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    # What every rank's run would otherwise import lazily (Dynamo: FakeTensorMode's first op).
    for name in ("torch._dynamo", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
                 "torch.distributed.fsdp", "torch.testing._internal.distributed.fake_pg"):
        importlib.import_module(name)
    with FakeTensorMode():
        (torch.ones(2, device="neuron") + 1).sum()
    try:
        tree = ast.parse(open(script, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    for name in sorted(names):
        try:
            importlib.import_module(name)
        except Exception:  # the program's own run reports it, on its line
            pass


def _run_rank_in_child(rank, size, nproc_per_node, capacity, script, argv):
    import pickle

    from torch_neuronx.simulate import recorder

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one rank, its record down the pipe, then gone
        os.close(read_end)
        code = 0
        try:
            record = _run_rank(rank, size, nproc_per_node, capacity, script, argv)
            data = pickle.dumps(record)
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as incoming:
        data = incoming.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        rec = recorder.RankRecord(rank)
        rec.error = f"the simulation of rank {rank} died (wait status {status}), e.g. out of host memory"
        return rec
    return pickle.loads(data)


def _run_rank(rank, size, nproc_per_node, capacity, script, argv):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_neuronx.simulate import recorder, world

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    rec = recorder.RankRecorder(rank, capacity, script)
    try:
        with world.simulated_rank(rank, size, nproc_per_node, script, argv, fake_mode):
            with fake_mode, rec:
                world.run_script(script, rank)
    except Exception as error:  # the program failed on this rank: the plan says where
        rec.record.error = f"{type(error).__name__}: {error}"
        rec.record.error_line = _line_of(error, script)
    return rec.record


def _line_of(error: BaseException, script: str) -> str | None:
    tb, line = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == script:
            line = f"{os.path.basename(script)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return line
