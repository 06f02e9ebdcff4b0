"""The `neuron` process group: torchrun launches of the scripts in tests/distributed/, each
comparing neuron results with Gloo on CPU or with one CPU process (the oracle), and the ways a
group fails."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import isolated
from helpers.isolated import environment, run

HERE = os.path.dirname(__file__)


def torchrun(script, ranks, result_dir, **env):
    """Run tests/distributed/<script> on `ranks` processes; each rank's report, sorted by rank."""
    r = isolated.torchrun(os.path.join(HERE, "distributed", script), ranks, RESULT_DIR=str(result_dir), **env)
    assert r.returncode == 0, r.stderr[-4000:]
    return sorted(p.read_text() for p in result_dir.glob("rank*.txt"))


def collective_checks(ranks: int) -> list[int]:
    """What tests/distributed/collectives.py checks on each rank: all_to_all's three where Trainium runs it
    (4, 8 or 16 ranks), and one more on the ranks of its subgroup."""
    base = 28 + (3 if ranks in (4, 8, 16) else 0)
    return [base + (rank < 2) for rank in range(ranks)]


@pytest.mark.parametrize("ranks, backend, reported, checked", [
    (2, "neuron", "neuron", "1"), pytest.param(2, "", "undefined", "1", marks=pytest.mark.long),
    pytest.param(4, "neuron", "neuron", "1", marks=pytest.mark.long),
    pytest.param(2, "neuron", "neuron", "0", marks=pytest.mark.long)])
def test_every_collective_equals_gloo_on_cpu(tmp_path, ranks, backend, reported, checked):
    # backend "": init_process_group() without one, as when neuron is the accelerator. Checks off: plain Gloo.
    reports = torchrun("collectives.py", ranks, tmp_path, PG_BACKEND=backend, TORCH_NEURONX_COLLECTIVE_CHECKS=checked)
    assert reports == [f"{rank} {reported} {n} node=0 core={rank}" for rank, n in enumerate(collective_checks(ranks))]


@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.long)])
def test_the_neuron_group_keeps_torchneuron_process_group_rules(tmp_path, ranks):
    """TorchNeuron's ProcessGroupNeuron (distributed/backend.py) and its collectives' checks: reduce leaves the
    other ranks' tensors, a one-tensor reduce_scatter list is split, reduce_scatter_tensor splits the dimension
    that differs, gathers squeeze, all_gather_coalesced goes [tensor][rank], AVG truncates integers,
    PREMUL_SUM; CPU and empty tensors, other reduce ops, bad roots, uneven splits and subgroup barriers refused
    in its words (tests/distributed/torchneuron_rules.py)."""
    checks = {2: [23, 23], 4: [29, 29, 28, 28]}[ranks]
    assert torchrun("torchneuron_rules.py", ranks, tmp_path) == [f"{rank} {n}" for rank, n in enumerate(checks)]


WIDE_CHECKS = 6  # what tests/distributed/wide_dtypes.py checks on each rank


@pytest.mark.parametrize("semantics", ["trainium", pytest.param("cpu", marks=pytest.mark.long)])
def test_collectives_send_int64_and_float64_as_torchneuron_does_under_its_semantics(tmp_path, semantics):
    """python_ops/xla_builder/op_impl.py: TorchNeuron's collectives run under autocast_neuron, so int64
    goes as int32 and float64 as float32; the default semantics send them exactly."""
    reports = torchrun("wide_dtypes.py", 2, tmp_path, TORCH_NEURONX_EAGER_SEMANTICS=semantics)
    assert reports == [f"{rank} {WIDE_CHECKS}" for rank in range(2)]


@pytest.mark.long  # two torchrun ranks: make test-long (CI runs it; make test stays under 10 minutes)
def test_the_report_names_int64_values_a_collective_sends_not_the_buffers_it_will_fill(tmp_path):
    reports = torchrun("wide_dtypes.py", 2, tmp_path, OBSERVE="1")
    with open(os.path.join(HERE, "distributed", "wide_dtypes.py")) as f:
        line = next(i for i, text in enumerate(f.read().splitlines(), 1) if text.startswith("dist.all_reduce(t)"))
    # the all_reduce and the all_gather of values beyond int32, on both ranks; not DDP's metadata exchange, nor
    # the copies (they move int64 as it is)
    assert reports == [f"{rank} {WIDE_CHECKS} {line}:c10d::allreduce_;{line + 7}:c10d::allgather_"
                       for rank in range(2)], reports


def test_under_torchrun_a_processs_core_is_neuron_local_rank_as_on_torchneuron(tmp_path):
    """TorchNeuron's numbering (NeuronDevice.cpp): device_count() the local world size, current_device()
    the local rank, another rank's index refused in TorchNeuron's words (tests/distributed/device_model.py)."""
    assert torchrun("device_model.py", 2, tmp_path) == ["0 22", "1 22"]


DDP_PROGRAM = os.path.join(HERE, "programs", "simulate", "ddp_train.py")


def cpu_full_batch_training(steps=3, hidden=32, layers=3, global_batch=32):
    """The oracle of ddp_train.py: the same model and global batches, one CPU process, full-batch steps."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(hidden, hidden), nn.Tanh()]
    model = nn.Sequential(*modules, nn.Linear(hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        inputs = torch.randn(global_batch, hidden)
        loss = F.mse_loss(model(inputs), inputs.sum(1, keepdim=True).sin())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses), torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("options", [[], pytest.param(["--accumulate", "2", "--gradient-as-bucket-view", "--bucket-cap-mb",
                                                          "0.001"], marks=pytest.mark.long)])
def test_the_cuda_idiom_trains_with_ddp_under_torchrun_as_one_cpu_process(tmp_path, options):
    """The issue's program: set_device(LOCAL_RANK), "neuron:<local rank>", DDP(device_ids=[local_rank]), on 4
    ranks; with no_sync() micro-batches and small buckets too."""
    import torch

    r = isolated.torchrun(DDP_PROGRAM, 4, *options, RESULT_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr[-4000:]
    losses, weights = cpu_full_batch_training()
    for rank in range(4):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(result["losses"], losses, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result["weights"], weights, rtol=1e-5, atol=1e-6)


@pytest.mark.long  # two torchrun ranks: make test-long (CI runs it; make test stays under 10 minutes)
def test_a_hard_coded_neuron_0_fails_on_local_rank_1_and_its_report_names_the_line(tmp_path):
    r = isolated.torchrun(DDP_PROGRAM, 2, "--hard-coded-device", TORCH_NEURONX_REPORT="1")
    assert r.returncode != 0
    assert "Device index 0 is out of range. Valid range is 1 to 1 for this process" in r.stderr, r.stderr[-3000:]
    with open(DDP_PROGRAM) as f:
        line = next(i for i, text in enumerate(f, 1) if text.startswith("torch.neuron.set_device("))
    report = r.stderr[r.stderr.index("rank 1 of 2"):]
    assert f"ddp_train.py:{line}  [another-rank-core]" in report.split("Would fail on Trainium (1 place)")[1], report


def test_a_neuron_tensor_before_the_group_is_refused_and_reported_at_its_line(tmp_path):
    script = tmp_path / "early.py"
    script.write_text("import os, torch, torch.distributed as dist\n"
                      "x = torch.ones(2, device='neuron')\n"
                      "dist.init_process_group('neuron', store=dist.HashStore(), rank=0, world_size=1)\n")
    r = run(f"import runpy, sys; sys.argv = ['run', '--output-dir', {str(tmp_path / 'report')!r}, {str(script)!r}]; "
            "runpy.run_module('torch_neuronx.run', run_name='__main__')", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    assert "AssertionError: Neuron runtime should not be initialized before the init_process_group" in r.stderr
    assert f"{script}:3  [runtime-before-group]" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("call, kind", [
    ("dist.all_reduce(torch.ones(2))", "collective-cpu-tensor"),
    ("dist.all_reduce(torch.ones(0, device='neuron'))", "collective-empty-tensor"),
    ("dist.all_to_all_single(torch.zeros(2, device='neuron'), torch.zeros(2, device='neuron'), [2], [2])",
     "collective-uneven-split"),
])
def test_a_collective_torchneuron_refuses_is_reported_at_its_line(tmp_path, call, kind):
    script = tmp_path / "refused.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('neuron', store=dist.HashStore(), rank=0, world_size=1)\n"
                      f"{call}\n")
    r = run(f"import runpy, sys; sys.argv = ['run', '--output-dir', {str(tmp_path / 'report')!r}, {str(script)!r}]; "
            "runpy.run_module('torch_neuronx.run', run_name='__main__')")
    assert f"{script}:3  [{kind}]" in r.stderr, r.stderr[-3000:]


def torchrun_nodes(script, nodes, procs_per_node, result_dir, **env):
    """Run tests/distributed/<script> as on `nodes` hosts: one torchrun launcher per node, started
    separately and joined by c10d rendezvous (loopback addresses only); each rank's report, sorted
    by rank."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
               f"--nproc-per-node={procs_per_node}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--local-addr=127.0.0.1",
               "--rdzv-conf=join_timeout=120", os.path.join(HERE, "distributed", script)]
    launch_env = environment(RESULT_DIR=str(result_dir), GLOO_SOCKET_IFNAME="lo", **env)
    launchers = [subprocess.Popen(command, env=launch_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(nodes)]
    try:
        outputs = [p.communicate(timeout=300) for p in launchers]
    finally:
        for p in launchers:  # a launcher left waiting for its peer: stop it (it stops its workers)
            if p.poll() is None:
                p.terminate()
                p.communicate(timeout=60)
    for p, (_, err) in zip(launchers, outputs):
        assert p.returncode == 0, err[-4000:]
    return sorted(p.read_text() for p in result_dir.glob("rank*.txt"))


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_two_nodes_run_every_collective_with_each_rank_on_its_nodes_local_core(tmp_path):
    # LOCAL_RANK starts at 0 on each node: ranks 0,1 on node 0 and 2,3 on node 1 take cores 0 and 1.
    reports = torchrun_nodes("collectives.py", 2, 2, tmp_path)
    assert reports == [f"{rank} neuron {n} node={rank // 2} core={rank % 2}" for rank, n in enumerate(collective_checks(4))]


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_two_nodes_ddp_fsdp2_and_tensor_parallel_equal_one_cpu_process(tmp_path):
    assert torchrun_nodes("parallel_training.py", 2, 1, tmp_path) == ["0 23", "1 23"]


@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.long)])
def test_dtensor_tensor_parallel_ddp_and_fsdp2_equal_one_cpu_process(tmp_path, ranks):
    assert torchrun("parallel_training.py", ranks, tmp_path) == [f"{rank} 23" for rank in range(ranks)]


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
@pytest.mark.parametrize("ranks, compiled", [(2, True), (4, False)])
def test_diffusers_tensor_parallel_both_paths_equal_the_unsharded_model(tmp_path, ranks, compiled):
    results = tmp_path / "results"
    results.mkdir()
    reports = torchrun("diffusers_tensor_parallel.py", ranks, results, MODEL_DIR=str(tmp_path / "flux2"),
                       COMPILE="1" if compiled else "0", TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"))
    checks = 4 if compiled else 2
    assert reports == [f"{rank} {checks}" for rank in range(ranks)]


@pytest.mark.parametrize("before, local_world, visible, expected", [
    ("", 5, "", "RuntimeError torchrun started 5 processes on this node, but an emulated trn2.3xlarge (LNC=2) has 4"),
    # TorchNeuron's _neuron_runtime_setup asserts both (distributed/backend.py)
    ("torch.ones(1, device='neuron')", 2, "",
     "AssertionError Neuron runtime should not be initialized before the init_process_group. Under torchrun"),
    ("", 2, "0-1", "RuntimeError Attempted to have more than one device per process in distributed setup"),
])
def test_a_process_that_cannot_be_bound_to_its_core_is_a_clear_error(before, local_world, visible, expected):
    r = run(f"""
        import os, torch, torch.distributed as dist
        {before}
        os.environ.update(LOCAL_RANK="1", LOCAL_WORLD_SIZE="{local_world}", RANK="0", WORLD_SIZE="1")
        try:
            dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
        except Exception as error:
            print(type(error).__name__, error)
    """, **({"NEURON_RT_VISIBLE_CORES": visible} if visible else {}))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(expected), r.stdout


def test_a_rank_given_its_core_by_the_user_is_still_numbered_by_its_local_rank():
    # NEURON_RT_VISIBLE_CORES exported per rank: the core is the user's, its index the LOCAL_RANK (TorchNeuron's
    # set_local_device_start_index), and DeviceMesh's set_device(LOCAL_RANK) takes it.
    r = run("""
        import os, torch, torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        os.environ.update(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", RANK="0", WORLD_SIZE="1")
        print(torch.neuron.device_count())  # before the group: the visible cores
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
        mesh = DeviceMesh("neuron", [0])
        print(torch.neuron.device_count(), torch.neuron.current_device(), torch.neuron.get_device_properties().core_id,
              torch.ones(1, device="neuron").device, mesh.device_type)
    """, NEURON_RT_VISIBLE_CORES="3")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "2", "1", "3", "neuron:1", "neuron"]


def test_a_launchers_core_count_gives_way_to_the_ranks_one_core():
    # NEURON_RT_NUM_CORES=2 exported for `accelerate launch` (2 processes): each process then has one core.
    r = run("""
        import os, torch, torch.distributed as dist
        os.environ.update(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", RANK="0", WORLD_SIZE="1")
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
        print(torch.neuron.device_count(), torch.neuron.current_device(), torch.neuron.get_device_properties().core_id)
    """, NEURON_RT_NUM_CORES="2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["2", "1", "1"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failing_group(failure, ranks=(0, 1), hosts=1, **env):
    """Start the given ranks of tests/distributed/failing_ranks.py, as on one host or each rank as
    on a host of its own (torchrun's node rank, GROUP_RANK, differs); {rank: (error, seconds)}."""
    group_env = environment(FAILURE=failure, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(_free_port()), **env)
    script = os.path.join(HERE, "distributed", "failing_ranks.py")
    started = time.monotonic()
    node = (lambda r: {"GROUP_RANK": str(r)}) if hosts > 1 else (lambda r: {})
    processes = [subprocess.Popen([sys.executable, script], env=dict(group_env, RANK=str(r), LOCAL_RANK=str(r), **node(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ranks]
    outcomes = {}
    for p in processes:
        out, err = p.communicate(timeout=120)
        for line in out.splitlines():
            if line.startswith("{"):
                report = json.loads(line)
                outcomes[report["rank"]] = (report["error"] or "", report["seconds"], err)
    return outcomes, time.monotonic() - started


def test_a_dead_peer_fails_the_survivor_within_the_timeout():
    outcomes, _ = failing_group("dead_peer")
    assert list(outcomes) == [0], outcomes  # rank 1 exited without a word
    error, seconds, stderr = outcomes[0]
    assert error.startswith("RuntimeError") and "1" in error, (error, stderr[-2000:])
    # The collective check notices first (the peer's process is gone), else Gloo (its connection is).
    assert any(s in error for s in ("rank 1 (pid", "Connection closed by peer", "Connection reset by peer")), error
    assert seconds < 5 + 20, seconds  # the group's timeout, plus start-up on a loaded machine


def test_a_rank_that_never_joins_fails_the_others_within_the_timeout():
    outcomes, _ = failing_group("never_joins", ranks=(0,))
    error, seconds, stderr = outcomes[0]
    assert "DistStoreError" in error and "1/2 clients joined" in error, (error, stderr[-2000:])
    assert 5 <= seconds < 5 + 20, seconds


@pytest.mark.parametrize("failure, expected", [
    ("shape_mismatch", ["all_reduce(float32[4], SUM)", "all_reduce(float32[5], SUM)"]),
    ("op_mismatch", ["all_reduce(float32[4], SUM)", "broadcast(float32[4], src=0)"]),
])
@pytest.mark.parametrize("hosts", [1, 2])  # compared through shared memory, or exchanged through Gloo
def test_ranks_that_disagree_on_a_collective_both_raise_naming_both_calls(failure, expected, hosts):
    outcomes, _ = failing_group(failure, hosts=hosts)
    assert sorted(outcomes) == [0, 1], outcomes
    for rank, (error, _, stderr) in outcomes.items():
        assert "Detected mismatch between collectives on ranks" in error, (rank, error, stderr[-2000:])
        assert all(e in error for e in expected), (rank, error)


def test_collective_checks_are_on_by_default_can_be_turned_off_and_reject_a_bad_value():
    code = """
        import os, torch, torch.distributed as dist
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
        from torch_neuronx.distributed import collective_checks_enabled
        group = dist.group.WORLD
        print(type(group).__name__, type(group._get_backend(torch.device("neuron"))).__name__, collective_checks_enabled())
        os.environ["TORCH_NEURONX_COLLECTIVE_CHECKS"] = "maybe"
        try:
            dist.new_group(backend="neuron")
        except ValueError as error:
            print(error)
    """
    default, off = run(code), run(code, TORCH_NEURONX_COLLECTIVE_CHECKS="0")
    for r in (default, off):
        assert r.returncode == 0, r.stderr[-2000:]
        assert "TORCH_NEURONX_COLLECTIVE_CHECKS='maybe' is not a boolean" in r.stdout.splitlines()[1], r.stdout
    # TorchNeuron's rules either way; the comparison across ranks (failing_group's tests) only when on
    assert default.stdout.splitlines()[0] == "ProcessGroupNeuron ProcessGroupGloo True"
    assert off.stdout.splitlines()[0] == "ProcessGroupNeuron ProcessGroupGloo False"


def test_the_neuron_group_runs_every_method_torchs_trampoline_covers_without_its_c_base():
    # torch's trampoline (PyProcessGroup.hpp) runs a Python group's C++ base method holding the GIL, so a
    # collective it covers that ProcessGroupNeuron left to its base (or called through super()) would enqueue
    # into Gloo holding the GIL and could deadlock with Gloo's worker (docs/notes.md 31). The methods are read
    # from the installed header: a torch that covers one more fails here.
    import inspect
    import re

    import torch
    from torch_neuronx.distributed.process_group import ProcessGroupNeuron

    header = os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc", "distributed", "c10d",
                          "PyProcessGroup.hpp")
    with open(header) as f:
        source = f.read()
    covered = set(re.findall(r"c10::intrusive_ptr<Work> (\w+)\(", source))
    assert {"allreduce", "broadcast", "send", "recv"} <= covered, covered
    for name in sorted(covered):
        method = ProcessGroupNeuron.__dict__.get(name)
        assert method is not None, f"ProcessGroupNeuron leaves {name} to torch's trampoline"
        body = inspect.getsource(method)
        assert "self._stock." in body or "self.alltoall(" in body or "self.reduce_scatter_single(" in body, body
        assert "super()" not in body, body


@pytest.mark.long  # two torchrun ranks compiling: make test-long (CI runs it; make test stays under 10 minutes)
def test_compiled_training_through_dtensor_parameters_gives_eagers_gradients():
    """AOTAutograd unwraps the DTensor parameters into plain forward and backward graphs, each compiled
    as any graph (inference too)."""
    r = run("""
        import torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
        torch.manual_seed(0)
        layer = parallelize_module(torch.nn.Linear(4, 4).to("neuron"), init_device_mesh("neuron", (1,)), ColwiseParallel())
        compiled = torch.compile(layer, backend="neuron", fullgraph=True)
        x = torch.randn(2, 4).to("neuron")
        with torch.no_grad():
            assert torch.allclose(compiled(x).cpu(), layer(x).cpu())
        loss = compiled(x).pow(2).sum()
        inference, forward = torch.neuron.get_dynamo_metrics()
        loss.backward()
        got = [p.grad.full_tensor().cpu().clone() for p in layer.parameters()]
        # Two graphs, the inference one and the training one; the backward compiled at the first
        # backward and added its time to the training graph's.
        training = torch.neuron.get_dynamo_metrics()[1]
        assert inference["compile_us"] > 0 and training["compile_us"] > forward["compile_us"] > 0, (forward, training)
        assert not inference["fell_back"] and not training["fell_back"], (inference, training)
        layer.zero_grad()
        layer(x).pow(2).sum().backward()
        for g, p in zip(got, layer.parameters()):
            torch.testing.assert_close(g, p.grad.full_tensor().cpu())
        print("TRAINED", [tuple(g.shape) for g in got])
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TRAINED [(4, 4), (4,)]" in r.stdout, r.stdout[-2000:]
