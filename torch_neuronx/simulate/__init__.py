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

from torch_neuronx.runtime import hardware
from torch_neuronx.simulate.engine import structure  # noqa: F401  (the runs per rank and their plan)
from torch_neuronx.simulate.steps import step  # noqa: F401  (the program's step marker)


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
    lnc = inst.chip.lnc_values[0] if lnc is None else lnc
    valid = inst.chip.lnc_problem(lnc)
    if valid:
        raise PlanError(f"--lnc {lnc} is not valid on {name}: use {valid}")
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
