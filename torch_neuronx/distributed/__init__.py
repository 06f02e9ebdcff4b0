"""The ``neuron`` c10d backend (TorchNeuron's ProcessGroupNeuron), built on Gloo.

``dist.init_process_group(backend="neuron")`` (or no backend, when neuron is the accelerator)
creates a ``ProcessGroupNeuron`` (``process_group``): TorchNeuron's rules for each collective
(``rules``), run by Gloo. torch's c10d ops for neuron tensors run through the core's zero-copy
fallback (``route_c10d_ops_to_fallback``), so Gloo reads and writes the neuron memory itself; a
group made without a backend argument gets its neuron backend mapped for CPU too on first use
(``c10d_fallback``). As TorchNeuron does (its ``_neuron_runtime_setup``), a
process launched by torchrun takes the core of its LOCAL_RANK when its first neuron group is
created: ``NEURON_RT_VISIBLE_CORES`` is set to it (unless the user set it), and that one core is
``neuron:<LOCAL_RANK>`` of ``LOCAL_WORLD_SIZE`` devices (``runtime.bind_devices``).

Gloo aborts a process whose peer sends a tensor of another size, and ranks that call different
collectives can hang or exchange the wrong bytes. So each neuron group checks, before every
collective, that all ranks run the same one on the same shapes and dtypes, and raises naming both
ranks' calls (``collective_checks``: through shared memory between the ranks of one host, else one
small all_gather). ``TORCH_NEURONX_COLLECTIVE_CHECKS=0`` turns it off; under
TORCH_DISTRIBUTED_DEBUG=DETAIL torch's own ProcessGroupWrapper (around the Gloo) checks instead.
DTensor gets sharding strategies for neuron's attention op with the first group (``sharding``).
"""
from __future__ import annotations

import atexit
import os
import socket
import time

import torch.distributed as dist

from torch_neuronx.distributed import sharding
from torch_neuronx.distributed.process_group import ProcessGroupNeuron
from torch_neuronx.runtime import BACKEND_NAME, apply_topology, bind_devices, env_flag, ops, topology

CHECKS_ENV = "TORCH_NEURONX_COLLECTIVE_CHECKS"
_bound = False
_exit_pause_registered = False
# Long enough for a worker thread to finish releasing one Work; nothing waits on it but exit.
EXIT_PAUSE_S = 0.05


def collective_checks_enabled() -> bool:
    """Whether neuron groups check that all ranks call the same collective (default: yes)."""
    return env_flag(CHECKS_ENV, default=True)


RUNTIME_STARTED = (
    "Neuron runtime should not be initialized before the init_process_group. Under torchrun the process is "
    "bound to its NeuronCore, neuron:<LOCAL_RANK>, when its first neuron process group is created, as on "
    "Trainium: create neuron tensors (and call torch.neuron.init()) after dist.init_process_group(backend='neuron').")


def bind_local_core(store, rank: int, world_size: int) -> None:
    """TorchNeuron's ``_neuron_runtime_setup``, once per process at its first neuron group: under
    torchrun (LOCAL_RANK set) the process sees the core of its LOCAL_RANK (NEURON_RT_VISIBLE_CORES,
    unless set) and numbers it ``neuron:<LOCAL_RANK>`` of LOCAL_WORLD_SIZE devices. Elsewhere nothing
    changes."""
    global _bound
    if _bound or "LOCAL_RANK" not in os.environ:
        return
    _bound = True
    if ops._is_initialized():
        raise AssertionError(RUNTIME_STARTED)
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = _local_world_size(store, rank, world_size)
    if "NEURON_RT_VISIBLE_CORES" not in os.environ:
        _check_fits_instance(local_world)
        os.environ["NEURON_RT_VISIBLE_CORES"] = str(local_rank)
        os.environ.pop(topology.NUM_CORES_ENV, None)  # the launcher's core count: this process now has one
    apply_topology()
    visible = topology.current().visible_cores
    if len(visible) != 1:
        raise RuntimeError(
            f"Attempted to have more than one device per process in distributed setup: NEURON_RT_VISIBLE_CORES="
            f"{os.environ['NEURON_RT_VISIBLE_CORES']!r} gives this process {len(visible)} cores. Give each "
            "process one core (leave NEURON_RT_VISIBLE_CORES unset under torchrun: it becomes the LOCAL_RANK).")
    bind_devices(local_rank, local_world)


def _local_world_size(store, rank: int, world_size: int) -> int:
    """LOCAL_WORLD_SIZE, or (as TorchNeuron does without it) the ranks that share this host, through the store."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    host = socket.gethostname()
    store.set(f"neuron_bind/host/{rank}", host)
    return sum(store.get(f"neuron_bind/host/{r}").decode() == host for r in range(world_size))


def _check_fits_instance(local_world: int) -> None:
    topo = topology.current()
    if local_world > topo.logical_cores:
        raise RuntimeError(
            f"torchrun started {local_world} processes on this node, but {topo.describe()} has "
            f"{topo.logical_cores} logical NeuronCores (one per process). Use --nproc_per_node={topo.logical_cores} "
            f"or fewer, or a larger instance (TORCH_NEURONX_INSTANCE_TYPE=trn2.48xlarge).")


def _let_gloo_workers_release_finished_work() -> None:
    """Gloo's worker thread drops a finished Work just after the caller was told it completed,
    and with it the user's CPU tensors, whose release takes the GIL. If that happens once the
    interpreter is finalizing, the thread is ended inside a destructor and the process aborts
    ("terminate called without an active exception"); torch's plain Gloo does this too. A group
    still referenced at exit (a subgroup in a variable) keeps its workers alive until then, so
    release the GIL for a moment while the interpreter is still whole."""
    time.sleep(EXIT_PAUSE_S)


def _create_backend(store, rank: int, world_size: int, timeout):
    global _exit_pause_registered
    bind_local_core(store, rank, world_size)
    if not _exit_pause_registered:
        atexit.register(_let_gloo_workers_release_finished_work)
        _exit_pause_registered = True
    gloo = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    sharding.install()  # DTensor's strategies for neuron's attention op, once a group exists
    detail = dist.get_debug_level() == dist.DebugLevel.DETAIL
    if detail:  # torch wraps a backend in its own checks; a ProcessGroup it takes as it is
        gloo = dist.distributed_c10d._create_process_group_wrapper(gloo, "neuron_detail", store, rank, world_size,
                                                                   timeout)
    return ProcessGroupNeuron(gloo, store, rank, world_size, timeout, collective_checks_enabled() and not detail)


def install() -> None:
    """Register ``neuron`` with c10d for neuron tensors, as TorchNeuron does (idempotent)."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=[BACKEND_NAME])
