"""One process standing in for a torchrun job: what a rank's program sees while it runs here.

Every rank's run sees what torchrun and the neuron backend would give it: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, ``init_process_group("neuron")`` succeeding (on torch's ``fake``
process group, which does no communication, with this rank's number) and ``dist.get_rank()``.

Its device follows TorchNeuron's numbering under torchrun (``distributed.bind_local_core``, run
here by the stand-in ``init_process_group``): before the group every core of the node is visible;
from then on the rank's one core is ``neuron:<LOCAL_RANK>`` of LOCAL_WORLD_SIZE devices. A bare
``"neuron"``, ``.to("neuron")``, ``.neuron()``, ``torch.neuron.current_device()``,
``set_device(local_rank)`` and ``"neuron:<local rank>"`` all name it; any other index (a fixed
``"neuron:0"`` on a local rank above 0) fails on its line with TorchNeuron's error, as on the
instance, and so does a neuron tensor made before ``init_process_group``. Two things make it so:
the runtime's current device is the only current device (C++ reads it to fill in a bare "neuron"
in ``Tensor.to`` and device guards), and every fake tensor's device passes :func:`_own_core`,
which checks it as the runtime checks a real one.

In structure mode the program runs under FakeTensorMode, which needs three more adjustments:
DeviceMesh keeps its rank map as a real CPU tensor (its code reads it with ``tolist()``), so the
mesh's methods run with fake mode paused; ``nn.Module.to()`` swaps fake parameters, which torch
refuses while FakeTensorMode's memo holds a weak reference to them, so the swap drops those memo
entries first (the memo maps real tensors to fakes; none of ours are real); and
``is_initialized()`` is true, so fake tensors take the current device for a bare "neuron" and
DeviceMesh leaves the device as the program set it.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import runpy
import sys
import weakref

import torch
import torch.distributed as dist

from torch_neuronx.runtime import BACKEND_NAME, apply_topology, frames, ops, topology

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                      "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


class ScriptFailed(Exception):
    """The user's program raised on one rank."""

    def __init__(self, rank: int, error: BaseException, line: str | None):
        super().__init__(f"rank {rank}: {type(error).__name__}: {error}")
        self.rank, self.error, self.line = rank, error, line


def prepare_process(instance: str, lnc: int) -> None:
    """Make this process's neuron device the chosen instance's node (before any neuron tensor)."""
    os.environ[topology.INSTANCE_TYPE_ENV] = instance
    os.environ[topology.LNC_ENV] = str(lnc)
    cores = topology.INSTANCES[instance].logical_cores(lnc)
    os.environ.pop(topology.VISIBLE_CORES_ENV, None)
    os.environ[topology.NUM_CORES_ENV] = str(min(cores, topology.MAX_TORCH_DEVICES))
    apply_topology()
    # Not initialized here: a child forked from an initialized runtime may not allocate (as with
    # CUDA), and the structure mode forks one child per rank. See simulated_rank's is_initialized.


@contextlib.contextmanager
def _patched(target, name, value):
    old = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, old)


def _real_mesh_patches(stack: contextlib.ExitStack) -> None:
    """DeviceMesh and init_device_mesh run with fake mode paused (their rank map stays real)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed import device_mesh

    def real(f):
        @functools.wraps(f)
        def call(*args, **kwargs):
            with unset_fake_temporarily():
                return f(*args, **kwargs)
        return call

    for name, f in list(vars(device_mesh.DeviceMesh).items()):
        if inspect.isfunction(f) and (not name.startswith("__") or name in ("__init__", "__getitem__")):
            stack.enter_context(_patched(device_mesh.DeviceMesh, name, real(f)))
    stack.enter_context(_patched(device_mesh, "init_device_mesh", real(device_mesh.init_device_mesh)))
    stack.enter_context(_patched(dist, "init_device_mesh", device_mesh.init_device_mesh))


class _Group:
    """Whether the rank's process group exists yet, and the first neuron tensor made before it."""

    def __init__(self):
        self.started = False
        self.early_tensor: str | None = None


def _own_core(stack: contextlib.ExitStack, group: _Group) -> None:
    """Every fake neuron tensor of this rank is checked as the runtime checks a real one: an index
    other than the rank's own core raises TorchNeuron's error, whichever route named it (a factory's
    ``device=``, ``Tensor.to``, DTensor and FSDP moving shards, a device guard). One made before the
    group is noted: the stand-in ``init_process_group`` then refuses, as TorchNeuron asserts."""
    from torch._subclasses.fake_tensor import FakeTensor

    saved = vars(FakeTensor)["_normalize_fake_device"]
    normalize = saved.__func__

    def normalize_own(device: torch.device) -> torch.device:
        device = normalize(device)  # a bare "neuron" gets the current device's index
        if device.type == BACKEND_NAME and device.index is not None:
            ops._check_device_index(device.index)
            if not group.started and group.early_tensor is None:
                group.early_tensor = frames.user_line()
        return device

    FakeTensor._normalize_fake_device = staticmethod(normalize_own)
    stack.callback(setattr, FakeTensor, "_normalize_fake_device", saved)


def _swap_patch(stack: contextlib.ExitStack, fake_mode) -> None:
    original = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        memo = fake_mode.fake_tensor_converter.tensor_memo
        keys = [r.key for t in (t1, t2) for r in weakref.getweakrefs(t) if isinstance(r, weakref.KeyedRef)]
        for key in keys:
            memo.pop(key, None)
        return original(t1, t2)

    stack.enter_context(_patched(torch.utils, "swap_tensors", swap_tensors))


def _rank_environment(rank: int, world: int, nproc_per_node: int) -> dict[str, str]:
    """The variables torchrun gives rank ``rank`` of ``world``."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % nproc_per_node),
            "LOCAL_WORLD_SIZE": str(nproc_per_node), "GROUP_RANK": str(rank // nproc_per_node),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "simulate"}


def _process_as_rank(stack: contextlib.ExitStack, env: dict[str, str], script: str, argv: list[str]) -> None:
    """The environment, sys.argv and sys.path[0] as the rank's process has them, until ``stack`` closes."""
    saved_env = {k: os.environ.get(k) for k in TORCHRUN_VARIABLES}
    saved_argv, saved_path0 = sys.argv, sys.path[0]

    def restore() -> None:
        sys.argv = saved_argv
        sys.path[0] = saved_path0
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    stack.callback(restore)
    os.environ.update(env)
    sys.argv = [script, *argv]
    sys.path[0] = os.path.dirname(script)


def _distributed_as_rank(stack: contextlib.ExitStack, rank: int, world: int, group: _Group, bind: bool) -> None:
    """init_process_group makes the fake group of this rank, whatever the program asked for, and (with
    ``bind``) numbers the rank's core as the neuron backend does under torchrun."""
    init_original = dist.init_process_group

    def init_process_group(*args, timeout=None, **kwargs):
        from torch.testing._internal.distributed.fake_pg import FakeStore

        from torch_neuronx import distributed
        from torch_neuronx.simulate import group as planned_group
        if bind and group.early_tensor is not None:
            raise AssertionError(f"{distributed.RUNTIME_STARTED} (the first neuron tensor: {group.early_tensor})")
        group.started = True
        if bind:
            distributed.bind_local_core(FakeStore(), rank, world)
        # Whatever the program asked for (neuron, gloo, env://, a TCPStore), the fake group stands in.
        planned_group.register()
        extra = {"timeout": timeout} if timeout is not None else {}
        return init_original(planned_group.NAME, world_size=world, rank=rank, store=FakeStore(), **extra)

    stack.enter_context(_patched(dist, "init_process_group", init_process_group))
    stack.enter_context(_patched(dist.distributed_c10d, "init_process_group", init_process_group))


@contextlib.contextmanager
def simulated_rank(rank: int, world: int, nproc_per_node: int, script: str, argv: list[str], fake_mode=None,
                   audit=None):
    """The process as rank ``rank`` of ``world`` sees it, for the duration of one run; with
    ``audit`` (a symmetry.Audit) every rank value it hands out notes the program's uses of it."""
    group = _Group()
    with contextlib.ExitStack() as stack:
        _process_as_rank(stack, _rank_environment(rank, world, nproc_per_node), script, argv)
        # Numbering binds once per process: in the forked child of one rank (structure mode), not in
        # the one process of --numerics, which stands for every rank as rank 0 (its own core is neuron:0).
        _distributed_as_rank(stack, rank, world, group, bind=fake_mode is not None)
        _own_core(stack, group)
        # Fake tensors take current_device() for a bare "neuron" only from an initialized device.
        stack.enter_context(_patched(torch.neuron, "is_initialized", lambda: True))
        # Backward on the caller's thread, as neuron's runs (interop/threads.py): its collectives (DDP's
        # buckets) are then seen under the program's own frames, at its loss.backward() line.
        stack.callback(torch._C._set_multithreading_enabled, torch._C._is_multithreading_enabled())
        torch._C._set_multithreading_enabled(False)
        from torch_neuronx.simulate import ddp
        ddp.install(stack)
        if fake_mode is not None:
            _real_mesh_patches(stack)
            _swap_patch(stack, fake_mode)
        if audit is not None:
            from torch_neuronx.simulate import symmetry
            stack.enter_context(symmetry.audited_sources(audit))
        stack.callback(_reset_distributed)  # first when the run ends: the stack closes last-in first-out
        yield


def _reset_distributed() -> None:
    """What one rank's run leaves behind must not leak into the next."""
    if dist.is_initialized():
        dist.destroy_process_group()
    from torch.distributed.tensor import _random

    _random._rng_tracker = None
    _clear_dtensor_caches()
    try:
        from torch.distributed.device_mesh import _mesh_resources
        _mesh_resources.mesh_stack.clear()
    except (ImportError, AttributeError):
        pass


def _clear_dtensor_caches() -> None:
    """DTensor caches sharding decisions and redistribution plans by DTensorSpec, whose mesh compares
    equal across runs (layout and names, not process groups): a cached result would hand the next
    rank the previous rank's mesh, whose groups no longer exist."""
    from torch.distributed.tensor import DTensor, _collective_utils, _redistribute

    propagator = DTensor._op_dispatcher.sharding_propagator
    for cached in (getattr(propagator.propagate_op_sharding, "cache", None),
                   getattr(propagator, "_propagate_tensor_meta_cached", None),
                   getattr(_redistribute, "_gen_transform_infos", None),
                   getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None)):
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()
    clear_native = getattr(torch._C, "_clear_dtensor_cache", None)  # a C++ dispatch cache, where there is one
    if clear_native is not None:
        clear_native()


def run_script(script: str, rank: int) -> None:
    """Run the program as ``__main__``; a SystemExit(0) or None is a normal end."""
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise ScriptFailed(rank, exit_, None) from None


def run_script_keeping_globals(script: str) -> dict:
    """Run the program as ``__main__`` and hand back its globals (the numerics mode reads them)."""
    try:
        return runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
        return {}
