"""python -m torch_neuronx.simulate: a torchrun program as N ranks in one process, its plan checked
against values computed here from the programs' own sizes and the hardware table, the numerics
against one device (the simulator's own reference run), and bad input."""
import os

import pytest

from torch_neuronx.runtime import hardware

PROGRAMS = os.path.join(os.path.dirname(__file__), "programs", "simulate")
GiB = 1 << 30


SMALL_LLAMA = ["--layers", "2", "--hidden", "64", "--ffn", "128", "--heads", "4", "--kv-heads", "4", "--vocab",
               "256", "--seq", "16", "--batch", "2", "--dtype", "float32"]


def line_of(program, marker):
    with open(os.path.join(PROGRAMS, program)) as f:
        return next(i for i, text in enumerate(f, 1) if marker in text)


def test_tp_mlp_on_64_ranks_of_a_trn2_48xlarge(tmp_path, simulate):
    hidden = 256
    r, plan = simulate(tmp_path, "--nproc-per-node", "64", "--instance", "trn2.48xlarge",
                       os.path.join(PROGRAMS, "tp_mlp.py"), env={"MLP_HIDDEN": str(hidden)})
    assert r.returncode == 0, r.stderr
    capacity = hardware.CHIPS["Trainium2"].core_memory(2)
    assert abs(capacity - 24 * GiB) < 0.01 * 24 * GiB  # 24 GiB less the runtime's 192 MiB
    assert [x["rank"] for x in plan["ranks"]] == list(range(64))
    # Each rank's parameter shards: Colwise (4h/64 rows of h, bias 4h/64), Rowwise (h cols of 4h/64, bias h).
    shard = 4 * (4 * hidden // 64 * hidden + 4 * hidden // 64 + hidden * 4 * hidden // 64 + hidden)
    for rank in plan["ranks"]:
        assert rank["capacity_bytes"] == capacity and rank["fits"]
        assert shard < rank["peak_bytes"] < capacity
        reduces = [c for c in rank["collectives"] if c["op"] == "all_reduce"]
        assert len(reduces) == 1 and reduces[0]["bytes"] == 8 * hidden * 4  # RowwiseParallel's output, float32
        assert reduces[0]["line"] == f"tp_mlp.py:{line_of('tp_mlp.py', 'out = model(x)')}"
    groups = {g["name"]: g for g in plan["groups"]}
    assert groups[plan["ranks"][5]["collectives"][-1]["group"]]["ranks"] == "0-63"
    assert plan["divergence"] is None and plan["communication"]["seconds"] > 0
    assert (tmp_path / "plan" / "plan.txt").exists() and (tmp_path / "plan" / "plan.html").exists()
    # The program never uses its rank: ranks 0 and 63 ran, the others are rank 0's relabelled.
    assert plan["simulation"]["script_runs"] == 2 and plan["simulation"]["symmetry"]["used"]


def test_relabelled_ranks_equal_every_rank_run(tmp_path, simulate):
    """The shortcut's plan is the plan of running every rank (TP groups {0,1}, {2,3}; FSDP {0,2}, {1,3})."""
    args = ["--nproc-per-node", "4", "--instance", "trn2.3xlarge", os.path.join(PROGRAMS, "llama_tp_fsdp.py"),
            *SMALL_LLAMA, "--layers", "1", "--tp", "2"]
    _, fast = simulate(tmp_path / "fast", *args)
    r, every = simulate(tmp_path / "every", "--all-ranks", *args)
    assert r.returncode == 0, r.stderr
    assert fast["simulation"]["script_runs"] == 2 and every["simulation"]["script_runs"] == 4
    assert [r.pop("relabelled_from", None) for r in fast["ranks"]] == [None, 0, 0, None]  # ranks 0 and 3 ran
    assert fast["ranks"] == every["ranks"] and fast["groups"] == every["groups"]
    ops = {c["op"] for c in every["ranks"][0]["collectives"]}
    assert {"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"} <= ops  # FSDP2 and TP
    tp_group = {g["name"]: g["ranks"] for g in every["groups"]}
    assert {tp_group[c["group"]] for c in every["ranks"][2]["collectives"]} == {"2-3", "0,2"}


def tp_peak_bytes(hidden, ffn, ranks, extra=0):
    """A rank's peak running tp_bare_device.py / device_habits.py (float32, no biases): it is reached
    while RowwiseParallel distributes the second weight, which is live in full, with its contiguous
    column chunks for the scatter (one more full copy) and the two shards of this rank; ``extra`` is
    what the program made before parallelize_module (device_habits.py's input)."""
    weight = hidden * ffn * 4
    return 2 * weight + 2 * weight // ranks + extra


def test_the_reported_bare_device_tp_program_on_64_ranks(tmp_path, simulate):
    """The report's program, unchanged (4096 x 16384, bare "neuron" for .to() and for a factory), on the
    64 ranks of a trn2.48xlarge: every rank planned, from the runs of ranks 0 and 63 alone."""
    hidden, ffn, n = 4096, 16384, 64
    r, plan = simulate(tmp_path, "--nproc-per-node", str(n), "--instance", "trn2.48xlarge",
                       os.path.join(PROGRAMS, "tp_bare_device.py"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan" / "plan.json").exists() and plan["world_size"] == n
    assert [x["rank"] for x in plan["ranks"]] == list(range(n))
    assert plan["simulation"]["script_runs"] == 2 and plan["simulation"]["symmetry"]["used"]
    assert [x.get("relabelled_from") for x in plan["ranks"]] == [None] + [0] * (n - 2) + [None]
    line = f"tp_bare_device.py:{line_of('tp_bare_device.py', '.sum().backward()')}"
    for rank in plan["ranks"]:
        assert "error" not in rank and rank["fits"]
        assert rank["peak_bytes"] == tp_peak_bytes(hidden, ffn, n)  # 520 MiB, of which 8 MiB this rank's shards
        # Each rank's parameters: a Colwise shard (ffn/n rows of hidden) and a Rowwise one (hidden x ffn/n).
        scatters = [c["shapes"] for c in rank["collectives"] if c["op"] == "scatter"]
        assert scatters == [f"float32[{ffn // n}, {hidden}]", f"float32[{hidden}, {ffn // n}]"]
        reduces = [c for c in rank["collectives"] if c["op"] == "all_reduce"]
        assert [(c["bytes"], c["line"]) for c in reduces] == [(8 * hidden * 4, line)]  # Rowwise's output
    assert [g["ranks"] for g in plan["groups"]] == ["0-63"]


def test_relabelled_ranks_of_the_bare_device_program_equal_every_rank_run(tmp_path, simulate):
    """The same program, narrow, on a trn2.3xlarge: the shortcut's plan is the plan of running every rank."""
    hidden, ffn, n = 64, 256, 4
    args = ["--nproc-per-node", str(n), "--instance", "trn2.3xlarge", os.path.join(PROGRAMS, "tp_bare_device.py")]
    env = {"TP_HIDDEN": str(hidden), "TP_FFN": str(ffn)}
    _, fast = simulate(tmp_path / "fast", *args, env=env)
    r, every = simulate(tmp_path / "every", "--all-ranks", *args, env=env)
    assert r.returncode == 0, r.stderr
    assert fast["simulation"]["script_runs"] == 2 and every["simulation"]["script_runs"] == n
    assert [x.pop("relabelled_from", None) for x in fast["ranks"]] == [None, 0, 0, None]
    assert fast["ranks"] == every["ranks"] and fast["groups"] == every["groups"]
    assert [x["peak_bytes"] for x in every["ranks"]] == [tp_peak_bytes(hidden, ffn, n)] * n


DEVICE_HABITS = ["bare", "to", "current_device", "device_of_current", "method", "set_device", "local_rank_index",
                 "device_context"]


@pytest.mark.parametrize("habit", DEVICE_HABITS)
def test_every_device_habit_is_the_ranks_own_core_on_every_rank(tmp_path, simulate, habit):
    """device_habits.py --habit: "neuron", .to("neuron"), current_device(), torch.device("neuron",
    current_device()), .neuron(), set_device(LOCAL_RANK), "neuron:<LOCAL_RANK>" and
    torch.neuron.device(LOCAL_RANK), each run on every rank of 2 nodes x 2 (local rank != rank on
    node 1); the program asserts its output, input and weights are on neuron:<LOCAL_RANK>."""
    hidden, ffn, n = 64, 256, 4
    r, plan = simulate(tmp_path, "--all-ranks", "--nnodes", "2", "--nproc-per-node", "2", "--instance",
                       "trn2.3xlarge", os.path.join(PROGRAMS, "device_habits.py"), "--habit", habit,
                       "--hidden", str(hidden), "--ffn", str(ffn))
    assert r.returncode == 0, r.stderr
    assert plan["simulation"]["script_runs"] == n and [x["local_rank"] for x in plan["ranks"]] == [0, 1, 0, 1]
    for rank in plan["ranks"]:
        assert "error" not in rank
        assert rank["peak_bytes"] == tp_peak_bytes(hidden, ffn, n, extra=8 * hidden * 4)
        assert [c["bytes"] for c in rank["collectives"] if c["op"] == "all_reduce"] == [8 * hidden * 4]


def test_a_hard_coded_neuron_0_fails_on_every_local_rank_above_0_naming_the_line(tmp_path, simulate):
    """As on Trainium: neuron:0 is the core of local rank 0 only (TorchNeuron's set_device refuses it
    elsewhere); with --all-ranks every rank runs and the failure names the ranks and the line."""
    r, plan = simulate(tmp_path, "--all-ranks", "--nnodes", "2", "--nproc-per-node", "2", "--instance",
                       "trn2.3xlarge", os.path.join(PROGRAMS, "device_habits.py"), "--habit", "index0")
    assert r.returncode == 1
    marker = 'model, x = mlp().to("neuron:0")'
    line = f"device_habits.py:{line_of('device_habits.py', marker)}"
    assert f"failed on ranks 1,3 at {line}: RuntimeError: Device index 0 is out of range. Valid range is 1 to 1 " \
           "for this process" in r.stderr, r.stderr
    assert ["error" in x for x in plan["ranks"]] == [False, True, False, True]


def test_a_program_naming_another_ranks_core_fails_naming_the_line(tmp_path, simulate):
    """neuron:1 on local rank 0: refused where it is made, with TorchNeuron's words, as on the instance."""
    r, plan = simulate(tmp_path, "--nproc-per-node", "2", "--instance", "trn2.3xlarge",
                       os.path.join(PROGRAMS, "mixed_devices.py"))
    assert r.returncode == 1
    line = f"mixed_devices.py:{line_of('mixed_devices.py', '# another rank')}"
    assert f"failed on rank 0 at {line}" in r.stderr and "Traceback" not in r.stderr
    error = plan["ranks"][0]["error"]
    assert error["line"] == line and "Device index 1 is out of range. Valid range is 0 to 0 for this process" \
        in error["message"]


def test_a_neuron_tensor_before_init_process_group_fails_as_torchneuron_asserts(tmp_path, simulate):
    script = tmp_path / "early.py"
    script.write_text("import torch, torch.distributed as dist\nx = torch.ones(2, device='neuron')\n"
                      "dist.init_process_group('neuron')\n")
    r, plan = simulate(tmp_path, "--nproc-per-node", "2", "--instance", "trn2.3xlarge", str(script))
    assert r.returncode == 1
    assert "failed on ranks 0-1 at early.py:3: AssertionError: Neuron runtime should not be initialized before the " \
           "init_process_group" in r.stderr and "(the first neuron tensor: early.py:2)" in r.stderr, r.stderr


def test_only_rank_3_calling_an_extra_all_reduce_fails_naming_it(tmp_path, simulate):
    r, plan = simulate(tmp_path, "--nproc-per-node", "8", os.path.join(PROGRAMS, "extra_all_reduce.py"))
    assert r.returncode == 1
    line = line_of("extra_all_reduce.py", "only rank 3 gets here")
    assert "rank 3 calls all_reduce(float32[4])" in r.stderr and f"extra_all_reduce.py:{line}" in r.stderr
    assert plan["divergence"]["rank"] == 3 and plan["divergence"]["index_in_group"] == 1
    assert plan["divergence"]["line"] == f"extra_all_reduce.py:{line}"
    # rank 0's `rank == 3` was seen: every rank ran.
    assert plan["simulation"]["script_runs"] == 8
    assert f"extra_all_reduce.py:{line - 1}: __eq__ of dist.get_rank()" in plan["simulation"]["symmetry"][
        "why_every_rank_ran"]


def test_a_rank_used_only_inside_torch_is_caught_by_the_last_rank(tmp_path, simulate):
    """torch.ones(rank) reads the rank in C, unseen; the last rank's run differs from rank 0's, so all run."""
    r, plan = simulate(tmp_path, "--nproc-per-node", "4", "--instance", "trn2.3xlarge",
                       os.path.join(PROGRAMS, "rank_sized.py"))
    assert r.returncode == 1 and plan["simulation"]["script_runs"] == 4
    assert "last rank differs" in plan["simulation"]["symmetry"]["why_every_rank_ran"]
    assert [r["peak_bytes"] for r in plan["ranks"]] == [4 * rank for rank in range(4)]
    assert plan["divergence"]["call"] == f"all_reduce(float32[1]) at rank_sized.py:{line_of('rank_sized.py', 'sizes')}"


@pytest.mark.long  # torchrun ranks beside the plan: make test-long (CI runs it; make test stays under 10 minutes)
def test_numerics_of_a_tp_x_fsdp_llama_equal_one_device(tmp_path, simulate):
    """TP=2 x FSDP2=2 on a 2-D mesh: the loss, the loss after one SGD step (gradients reduce-scattered)
    and the FSDP-sharded output weight after the step (`p`, the program's last parameter)."""
    r, plan = simulate(tmp_path, "--numerics", "--nproc-per-node", "4", "--instance", "trn2.3xlarge",
                       os.path.join(PROGRAMS, "llama_tp_fsdp.py"), *SMALL_LLAMA, "--tp", "2")
    assert r.returncode == 0, r.stderr
    outputs = plan["numerics"]["outputs"]
    assert {"loss", "loss_after", "p"} <= set(outputs) and all(o["ok"] for o in outputs.values())
    assert outputs["p"]["shape"] == [256, 64]  # SMALL_LLAMA's vocab x hidden, gathered from its shards
    assert outputs["loss_after"]["max_abs_difference"] < 1e-5


def test_numerics_fail_when_the_values_differ(tmp_path, simulate):
    r, plan = simulate(tmp_path, "--numerics", "--nproc-per-node", "2", "--instance", "trn2.3xlarge",
                       os.path.join(PROGRAMS, "world_scaled.py"))
    assert r.returncode == 1 and not plan["numerics"]["ok"]
    assert plan["numerics"]["outputs"]["scaled"]["max_abs_difference"] == 1.0  # 2 ranks' value vs one's


def test_flux2_tensor_parallel_on_a_trn2_3xlarge(tmp_path, simulate):
    """diffusers' Flux2 transformer (1 double and 1 single block, hidden 4 x 16) TP over 2 of the 4 cores
    (the benchmark runs 4B on 4): each block's row-parallel outputs are all_reduced (double block: image
    and text attention and MLP; single block: one)."""
    image, text, hidden = 64, 16, 64
    r, plan = simulate(tmp_path, "--nproc-per-node", "2", "--instance", "trn2.3xlarge",
                       os.path.join(PROGRAMS, "flux2_tensor_parallel.py"), "--small", "--image-tokens", str(image),
                       "--text-tokens", str(text))
    assert r.returncode == 0, r.stderr
    # bf16 bytes of a rank's parameters (diffusers 0.42.1's _tp_plan: colwise weights and biases and
    # rowwise weights halved, the rest whole): live for the whole run.
    params = 319680
    for rank in plan["ranks"]:
        # Unsharded, the parameters alone (479424) plus these activations (~170 kB) would pass 600 kB.
        assert params <= rank["peak_bytes"] < 600_000
        assert sorted(c["bytes"] for c in rank["collectives"] for _ in range(c["calls"])) == sorted(
            2 * hidden * n for n in (text, image, image, text, image + text))
        assert {c["op"] for c in rank["collectives"]} == {"all_reduce"}
    assert [g["ranks"] for g in plan["groups"]] == ["0-1"]


def test_an_allocation_over_hbm_is_named(tmp_path, simulate):
    r, plan = simulate(tmp_path, "--nproc-per-node", "2", "--instance", "trn2.3xlarge",
                       os.path.join(PROGRAMS, "over_hbm.py"))
    assert r.returncode == 1
    line = f"over_hbm.py:{line_of('over_hbm.py', 'the allocation that does not fit')}"
    assert [o["rank"] for o in plan["over_capacity"]] == [1] and plan["over_capacity"][0]["line"] == line
    assert plan["ranks"][1]["peak_bytes"] >= 30 * GiB and plan["ranks"][0]["fits"]


@pytest.mark.parametrize("args, says", [
    (["--instance", "p4d.24xlarge"], "unknown instance 'p4d.24xlarge'"),
    (["--nproc-per-node", "5", "--instance", "trn2.3xlarge"], "--nproc-per-node 5 is more than the 4 logical"),
    (["--lnc", "3"], "--lnc 3 is not valid on trn2.48xlarge"),
    (["--jobs", "0"], "--jobs 0: give 1 or more"),
])
def test_bad_input_names_problem_and_fix(tmp_path, capsys, args, says):
    from torch_neuronx.simulate.__main__ import main  # in this process: it stops before any rank runs
    assert main(["--out", str(tmp_path), *args, os.path.join(PROGRAMS, "tp_mlp.py")]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not os.listdir(tmp_path)


def test_a_missing_script_is_named(tmp_path, capsys):
    from torch_neuronx.simulate.__main__ import main
    assert main([str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "nope.py" in err and "does not exist" in err


def test_instances_and_their_ranks_match_the_hardware_table():
    from torch_neuronx.simulate import resolve
    inst, nodes, lnc = resolve("trn2.48xlarge", None, 64, None)
    assert (inst.logical_cores(lnc), nodes, lnc) == (64, 1, 2)
    inst, nodes, lnc = resolve("trn2.48xlarge", None, 128, 1)
    assert inst.logical_cores(lnc) == 128
    assert resolve("2xtrn2.48xlarge", None, 64, None)[1] == 2 == resolve("trn2.48xlarge", 2, 64, None)[1]
    inst, nodes, _ = resolve("trn3-gen1-ultraserver", None, 64, None)
    assert (inst.name, nodes, inst.chips * nodes) == ("trn3-gen1", 4, 64)  # AWS: 64 Trainium3 per Gen1 UltraServer
    inst, nodes, _ = resolve("trn3-gen2-ultraserver", None, 16, None)
    assert (inst.chips * nodes) == 144
