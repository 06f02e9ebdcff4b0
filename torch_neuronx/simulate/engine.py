"""The engine of ``python -m torch_neuronx.simulate``: the program run once per rank, each in a
forked child under fake tensors, then the records made into the plan (:mod:`.plan`). Ranks the
program provably treats alike are not run but relabelled (:mod:`.symmetry`)."""
from __future__ import annotations

import dataclasses
import gc
import os
import time
from typing import TYPE_CHECKING, Any

from torch_neuronx.runtime import hardware
from torch_neuronx.simulate.rows import Simulation, Symmetry

if TYPE_CHECKING:
    from torch_neuronx.simulate import plan


def structure(script: str, argv, instance: hardware.Instance, nnodes: int, nproc_per_node: int, lnc: int,
              progress=None, jobs: int | None = None, all_ranks: bool = False) -> plan.Plan:
    """Run the program per rank under fake tensors; its plan (:class:`.plan.Plan`).

    Each rank runs in a forked child of this process, ``jobs`` at a time: it starts from the same
    warm state (torch and the program's imports loaded once, here) and leaves nothing behind for
    the next rank. DTensor, DeviceMesh and FSDP keep process-wide caches keyed by meshes that
    compare equal across ranks; a second rank run in the same process would be handed the first
    one's process groups.

    Rank 0 and the last rank run first. When the program never used its rank and the last rank's
    record is rank 0's relabelled, the other ranks' records are rank 0's relabelled (the argument
    is in :mod:`.symmetry`); otherwise, or with ``all_ranks``, every rank runs."""
    from torch_neuronx.simulate import plan, world

    world.prepare_process(instance.name, lnc)
    _preimport(script)
    run = _Runs(nnodes * nproc_per_node, nproc_per_node, instance.chip.core_memory(lnc), script, argv, progress,
                max(1, jobs or min(2, os.cpu_count() or 1)))
    start = time.perf_counter()
    gc.collect()
    gc.freeze()  # the children share these pages; their collections skip them
    try:
        records, done, why = _records(run, all_ranks)
    finally:
        gc.unfreeze()
    layout = plan.Layout(instance, lnc, nnodes, nproc_per_node)
    runs = sum(1 for rec in records if rec.relabelled_from is None)
    if progress is not None and runs < len(records):
        progress(None, None)  # the runs are done; relabelling and costing the rest
    simulation = Simulation(time.perf_counter() - start, runs, Symmetry(
        used=runs < len(records), jobs=run.jobs, why_every_rank_ran="--all-ranks" if all_ranks else why,
        rank0_rank_uses=done[0].rank_uses if 0 in done else []))
    return plan.build(records, layout, run.capacity, script, argv, simulation)


@dataclasses.dataclass
class _Runs:
    """What every rank's run of one simulation shares."""
    size: int
    nproc_per_node: int
    capacity: int
    script: str
    argv: list
    progress: Any
    jobs: int


def _records(run: _Runs, all_ranks: bool) -> tuple[list, dict, str | None]:
    """(every rank's record, the records of the ranks that ran, why every rank ran or None): rank 0
    and the last first, then the others run, or are rank 0's relabelled where symmetry allows."""
    from torch_neuronx.simulate import costing, symmetry

    done = _run_ranks(sorted({0, run.size - 1}), run)
    why = None if all_ranks else _why_not_symmetric(done, run.size)
    if why is None and not all_ranks:
        tiling = symmetry.Tiling(run.size)
        costing.grouped_collectives(done[0])  # once, before its relabelled copies share it
        return [done.get(rank) or symmetry.relabel_lightly(done[0], rank, tiling) for rank in range(run.size)], \
            done, why
    rest = [r for r in range(run.size) if r not in done]
    if all_ranks or not any(rec.error for rec in done.values()):  # --all-ranks: each rank's failure, too
        done.update(_run_ranks(rest, run, keep_going=all_ranks))
    return [done[r] for r in sorted(done)], done, why


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


def _run_ranks(ranks, run: _Runs, keep_going: bool = False) -> dict:
    """{rank: record} for ``ranks``, each run in its own forked child, ``run.jobs`` at a time; stops
    starting new ones after a rank fails, unless ``keep_going``."""
    import tempfile

    results, running, todo = {}, {}, list(ranks)
    with tempfile.TemporaryDirectory(prefix="neuron_simulate_") as tmp:
        while todo or running:
            failed = not keep_going and any(rec.error for rec in results.values())
            while todo and len(running) < run.jobs and not failed:
                rank = todo.pop(0)
                path = os.path.join(tmp, f"rank{rank}.pickle")
                running[_fork_rank(rank, path, run)] = (rank, path)
            if not running:
                break
            pid, status = os.wait()
            if pid not in running:
                continue
            rank, path = running.pop(pid)
            results[rank] = _child_record(rank, path, status)
            if run.progress:
                run.progress(rank, results[rank])
    return results


def _fork_rank(rank: int, path: str, run: _Runs) -> int:
    """Fork a child that runs ``rank`` and pickles its record to ``path``; the child's pid."""
    import pickle

    pid = os.fork()
    if pid == 0:  # the child: one rank, its record in a file, then gone
        code = 0
        try:
            record = _run_rank(rank, run.size, run.nproc_per_node, run.capacity, run.script, list(run.argv))
            with open(path, "wb") as out:
                pickle.dump(record, out)
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 1
        finally:
            os._exit(code)
    return pid


def _child_record(rank: int, path: str, status: int):
    """The record a child left, or one saying it died."""
    import pickle

    from torch_neuronx.simulate import recorder

    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        rec = recorder.RankRecord(rank)
        rec.error = f"the simulation of rank {rank} died (wait status {status}), e.g. out of host memory"
        return rec


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

    from torch_neuronx.simulate import recorder, symmetry, world

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    rec = recorder.RankRecorder(rank, capacity, script)
    audit = symmetry.Audit()
    try:
        with world.simulated_rank(rank, size, nproc_per_node, script, argv, fake_mode, audit):
            with fake_mode, rec:
                world.run_script(script, rank)
    except Exception as error:  # the program failed on this rank: the plan says where
        rec.record.error = f"{type(error).__name__}: {error}"
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
