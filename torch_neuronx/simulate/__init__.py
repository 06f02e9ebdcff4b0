"""Check a torchrun program's plan for N x M ranks in one process, before renting the instances.

``python -m torch_neuronx.simulate --nproc-per-node 64 --instance trn2.48xlarge train.py ARGS``
runs the unchanged program once per rank, under torch's FakeTensorMode (no data, full size) on
torch's ``fake`` process group (no communication) standing in for ``neuron``. Each run records
that rank's neuron memory and collectives (:mod:`.recorder`); the plan (:mod:`.plan`) compares
every rank's peak with its core's HBM, estimates the collectives' time on the instance's links and
fails when the members of a process group disagree on their calls. ``--numerics`` runs it once
under ``LocalTensorMode`` (torch.distributed._local_tensor: every rank's real values in one
process) and compares the program's top-level tensors with one device's (:mod:`.numerics`).

Why runs per rank, and not one run for all: a program may branch on its rank (``if rank == 0``),
and only running that rank's code shows what it does. Fake tensors make a run cheap: no data is
allocated, each op only computes shapes. Ranks 0 and N-1 always run; the others run too unless
the program provably does the same on every rank (:mod:`.symmetry`), when their records are rank
0's with the groups translated.
"""
from __future__ import annotations

import gc
import os
import time

from torch_neuronx.runtime import hardware
from torch_neuronx.simulate.steps import step  # noqa: F401  (the program's step marker)

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
              progress=None, jobs: int | None = None, all_ranks: bool = False) -> dict:
    """Run the program per rank under fake tensors; the plan (a dict, see :mod:`.plan`).

    Each rank runs in a forked child of this process, ``jobs`` at a time: it starts from the same
    warm state (torch and the program's imports loaded once, here) and leaves nothing behind for
    the next rank. DTensor, DeviceMesh and FSDP keep process-wide caches keyed by meshes that
    compare equal across ranks; a second rank run in the same process would be handed the first
    one's process groups.

    Rank 0 and the last rank run first. When the program never used its rank and the last rank's
    record is rank 0's relabelled, the other ranks' records are rank 0's relabelled (the argument
    is in :mod:`.symmetry`); otherwise, or with ``all_ranks``, every rank runs."""
    from torch_neuronx.simulate import plan, symmetry, world

    world.prepare_process(instance.name, lnc)
    _preimport(script)
    capacity = instance.chip.core_memory(lnc)
    size = nnodes * nproc_per_node
    jobs = max(1, jobs or min(2, os.cpu_count() or 1))
    start = time.perf_counter()
    gc.collect()
    gc.freeze()  # the children share these pages; their collections skip them
    try:
        first = sorted({0, size - 1})
        done = _run_ranks(first, jobs, size, nproc_per_node, capacity, script, argv, progress)
        why = None if all_ranks else _why_not_symmetric(done, size)
        if why is None and not all_ranks:
            tiling = symmetry.Tiling(size)
            records = [done.get(rank) or symmetry.relabel_lightly(done[0], rank, tiling) for rank in range(size)]
        else:
            rest = [r for r in range(size) if r not in done]
            if not any(rec.error for rec in done.values()):
                done.update(_run_ranks(rest, jobs, size, nproc_per_node, capacity, script, argv, progress))
            records = [done[r] for r in sorted(done)]
    finally:
        gc.unfreeze()
    layout = plan.Layout(instance, lnc, nnodes, nproc_per_node)
    runs = sum(1 for rec in records if rec.relabelled_from is None)
    if progress is not None and runs < len(records):
        progress(None, None)  # the runs are done; relabelling and costing the rest
    result = plan.build(records, layout, capacity, script, argv, time.perf_counter() - start, runs)
    result["simulation"]["symmetry"] = {
        "used": runs < len(records), "jobs": jobs,
        "why_every_rank_ran": "--all-ranks" if all_ranks else why,
        "rank0_rank_uses": done[0].rank_uses if 0 in done else [],
    }
    return result


def _why_not_symmetric(done: dict, size: int) -> str | None:
    """None when ranks 0 and size-1 show the program is the same on every rank (symmetry.py)."""
    from torch_neuronx.simulate import symmetry

    if size <= 2:
        return "every rank ran (at most two)"
    first, last = done[0], done[size - 1]
    for rec in (first, last):
        if rec.error:
            return f"rank {rec.rank} failed"
        if rec.rank_uses:
            return (f"the program uses its rank ({rec.rank_use_count} uses on rank {rec.rank}; first: "
                    f"{rec.rank_uses[0]})")
    relabelled = symmetry.relabel(first, size - 1, symmetry.Tiling(size))
    if relabelled is None:
        return "a process group of rank 0 is not one of a tiling of the world by translation"
    differs = symmetry.same_record(relabelled, last)
    if differs:
        return f"the last rank differs from rank 0 relabelled: {differs}"
    return None


def _run_ranks(ranks, jobs, size, nproc_per_node, capacity, script, argv, progress) -> dict:
    """{rank: record} for ``ranks``, each run in its own forked child, ``jobs`` at a time; stops
    starting new ones after a rank fails."""
    import pickle
    import tempfile

    from torch_neuronx.simulate import recorder

    results, running, todo = {}, {}, list(ranks)
    with tempfile.TemporaryDirectory(prefix="neuron_simulate_") as tmp:
        while todo or running:
            failed = any(rec.error for rec in results.values())
            while todo and len(running) < jobs and not failed:
                rank = todo.pop(0)
                path = os.path.join(tmp, f"rank{rank}.pickle")
                pid = os.fork()
                if pid == 0:  # the child: one rank, its record in a file, then gone
                    code = 0
                    try:
                        record = _run_rank(rank, size, nproc_per_node, capacity, script, list(argv))
                        with open(path, "wb") as out:
                            pickle.dump(record, out)
                    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
                        code = 1
                    finally:
                        os._exit(code)
                running[pid] = (rank, path)
            if not running:
                break
            pid, status = os.wait()
            if pid not in running:
                continue
            rank, path = running.pop(pid)
            try:
                with open(path, "rb") as f:
                    rec = pickle.load(f)
            except (OSError, EOFError, pickle.UnpicklingError):
                rec = recorder.RankRecord(rank)
                rec.error = f"the simulation of rank {rank} died (wait status {status}), e.g. out of host memory"
            results[rank] = rec
            if progress:
                progress(rank, rec)
    return results


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


def _run_rank(rank, size, nproc_per_node, capacity, script, argv):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_neuronx.simulate import recorder, world

    from torch_neuronx.simulate import symmetry

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    rec = recorder.RankRecorder(rank, capacity, script)
    audit = symmetry.Audit()
    try:
        with world.simulated_rank(rank, size, nproc_per_node, script, argv, fake_mode, audit):
            with fake_mode, rec:
                world.run_script(script, rank)
    except Exception as error:  # the program failed on this rank: the plan says where
        rec.record.error = f"{type(error).__name__}: {error}"
        if type(error).__name__ == "FakeTensorDeviceMismatchError":  # what the device names meant here
            local = rank % nproc_per_node
            own = f"'neuron', 'neuron:0' and 'neuron:{local}' (its local rank)" if local else "'neuron' and 'neuron:0'"
            rec.record.error += (f"; on rank {rank} {own} name the rank's own core, shown as neuron:0, and any "
                                 "other index another core of the node, which this line mixes with it")
        rec.record.error_line = _line_of(error, script)
    rec.record.rank_uses, rec.record.rank_use_count = audit.notes, audit.count
    return rec.record


def _line_of(error: BaseException, script: str) -> str | None:
    tb, line = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == script:
            line = f"{os.path.basename(script)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return line
