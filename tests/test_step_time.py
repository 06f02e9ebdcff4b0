"""Time on Trainium (trainium/time_model.py): the model by hand, the step marker, the plan's time per
rank and per step, --recost, a 1,024-rank plan, and the readiness report and the plan giving one program
the same time."""
import json
import math
import os
import subprocess
import sys

import pytest

from torch_neuronx.trainium import cost_model, time_model
from torch_neuronx.runtime import hardware
from torch_neuronx.simulate import step

PROGRAMS = os.path.join(os.path.dirname(__file__), "programs", "simulate")


# ---- the model by hand -------------------------------------------------------------------------
def test_a_collective_costs_a_fixed_cost_its_ring_steps_and_its_bytes_over_the_link():
    cal = time_model.CALIBRATION
    latency, transfer = time_model.collective_seconds("all_reduce", 16384, 64, 256e9, "NeuronLink", "Trainium2")
    assert latency == pytest.approx(cal.collective_s + 2 * 63 * cal.step_latency_s["NeuronLink"])
    assert transfer == pytest.approx(2 * 63 / 64 * 16384 / (256e9 * cal.link_fraction["Trainium2"]))
    latency, transfer = time_model.collective_seconds("all_gather_into_tensor", 1 << 20, 32, 3.1e9, "EFA", "Trainium")
    assert latency == pytest.approx(cal.collective_s + 31 * cal.step_latency_s["EFA"])
    assert transfer == pytest.approx(31 / 32 * (1 << 20) / (3.1e9 * cal.link_fraction["EFA"]))
    on_trn1 = time_model.collective_seconds("all_gather_into_tensor", 1 << 20, 32, 3.1e9, "NeuronLink", "Trainium")
    assert on_trn1[1] == pytest.approx(31 / 32 * (1 << 20) / (3.1e9 * cal.link_fraction["Trainium"]))
    on_trn3 = time_model.collective_seconds("broadcast", 100, 8, 1e9, "on chip (assumed)", "Trainium3")
    assert on_trn3[0] == pytest.approx(cal.collective_s + 3 * cal.step_latency_s["NeuronLink"])
    assert on_trn3[1] == pytest.approx(100 / (1e9 * cal.link_fraction[time_model.DEFAULT_LINK_CHIP]))
    assert time_model.collective_seconds("all_reduce", 100, 1, 1e9, "NeuronLink", "Trainium2") == (0.0, 0.0)


def test_a_span_is_one_estimate_with_its_interval_and_bounds():
    cal = time_model.CALIBRATION
    span = time_model.Span(compute_s=1e-3, eager_launches=10, graph_launches=2, comm_latency_s=3e-4,
                           comm_transfer_s=2e-4, hidden_s=1e-4)
    launches = 10 * cal.eager_launch_s + 2 * cal.graph_launch_s
    assert span.seconds() == pytest.approx(1e-3 + launches + 5e-4 - 1e-4)  # only what is known hidden is
    assert span.bounds() == pytest.approx((max(1e-3 + launches, 5e-4), 1e-3 + launches + 5e-4))
    low, high = cal.interval(span.seconds())
    assert low < span.seconds() < high and high / low == pytest.approx(cal.held_out[1] / cal.held_out[0])
    comm_bound = time_model.Span(compute_s=1e-4, comm_latency_s=1e-3)
    assert comm_bound.bounds()[0] == pytest.approx(1e-3)  # hidden under nothing: the collectives' time


def test_a_graphs_collective_hides_under_the_work_that_does_not_need_it():
    """One NEFF: the links run its collectives one at a time from their launch; the compute engine runs
    the work that feeds a later collective in order, waiting for the results it reads, and the rest
    (work no collective needs: weight gradients) whenever it would wait."""
    work, cost = {"a": 3.0, "b": 2.0, "c": 1.0}, {0: 4.0, 1: 1.0}

    def hidden(*events):
        return time_model.scheduled_hidden(events, lambda w: sum(work[k] * n for k, n in w.items()), cost.get)
    # TP: the next op needs the all-reduce's result: nothing hides.
    assert hidden(("work", {"a": 1}, (), False), ("collective", 0), ("work", {"b": 1}, (0,), False)) == 0.0
    # A reduce-scatter of the input gradient, then the weight gradient's matmul (b), which no
    # collective needs: it runs under it, min(4, 2) hidden...
    rs_then_wgrad = (("work", {"a": 1}, (), False), ("collective", 0), ("work", {"b": 1}, (), True),
                     ("work", {"c": 1}, (0,), False))
    assert hidden(*rs_then_wgrad) == 2.0
    # ...even when the graph computes the weight gradient before launching the reduce-scatter.
    assert hidden(("work", {"a": 1}, (), False), ("work", {"b": 1}, (), True), ("collective", 0),
                  ("work", {"c": 1}, (0,), False)) == 2.0
    # Two collectives queue on the links (3-7, 7-8); the work after them (b, c) ends at 6 and the last op
    # waits for the second, ending at 11: of 9 s of work and 5 s on the links, 3 hidden.
    assert hidden(("work", {"a": 1}, (), False), ("collective", 0), ("collective", 1),
                  ("work", {"b": 1, "c": 1}, (), False), ("work", {"a": 1}, (1,), False)) == pytest.approx(3.0)


def test_a_fused_graph_moves_its_inputs_and_outputs_only():
    from torch_neuronx.trainium.cost_model import TensorMeta
    import torch

    f32 = lambda *shape: TensorMeta(shape, torch.float32, "neuron")  # noqa: E731
    account = time_model.FusedAccount()
    account.add_input("x", f32(32, 64).nbytes)
    account.add_input("w", f32(64, 64).nbytes)
    mm = account.op("aten::mm", [("x", f32(32, 64)), ("w", f32(64, 64))], [("y", f32(32, 64))])
    assert mm == ("fp32", 2 * 32 * 64 * 64, (32 * 64 + 64 * 64) * 4)
    gelu = account.op("aten::gelu", [("y", f32(32, 64))], [("z", f32(32, 64))])
    assert gelu[2] == 0  # y stays on chip
    again = account.op("aten::mul.Tensor", [("z", f32(32, 64)), ("x", f32(32, 64))], [("o", f32(32, 64))])
    assert again[2] == 0  # x was read once already
    assert account.finish([("o", f32(32, 64)), ("o", f32(32, 64))]) == 32 * 64 * 4
    # A KV cache updated in place: the new row is written; the cache is read at its first use after.
    cache = account.add_input("cache", f32(1, 4096, 128).nbytes)
    update = account.op("aten::index_copy", [("cache", f32(1, 4096, 128)), ("pos", f32(1)), ("row", f32(1, 1, 128))],
                        [("cache2", f32(1, 4096, 128))])
    assert cache is None and update[2] == 2 * (4 + 128 * 4)
    attend = account.op("aten::bmm", [("q", f32(1, 1, 4096)), ("cache2", f32(1, 4096, 128))], [("a", f32(1, 1, 128))])
    assert attend[2] == 4096 * 128 * 4
    assert account.op("aten::copy_", [("cache", f32(1, 4096, 128)), ("cache2", f32(1, 4096, 128))],
                      [("cache", f32(1, 4096, 128))])[2] == 0  # written back where it lives


def test_the_calibration_names_its_rows_and_its_out_of_sample_error():
    from torch_neuronx.trainium import calibration

    cal = time_model.CALIBRATION
    assert 0 < cal.compute_fraction <= 1 and 0 < cal.hbm_fraction <= 1
    assert all(0 < v <= 1 for v in cal.link_fraction.values())
    assert sorted(cal.fitted_to) == sorted(map(calibration.label, calibration.ROWS.values()))
    assert len(cal.fitted_to) >= 8
    assert cal.held_out[0] < 1 < cal.held_out[1] and 1 / 1.5 <= cal.held_out[0] and cal.held_out[1] <= 1.5
    text = " ".join(time_model.assumptions())
    assert f"{cal.compute_fraction:.0%}" in text and "NeuronLink" in text and "EFA" in text
    assert f"{cal.held_out[0]:.2f}x to {cal.held_out[1]:.2f}x" in text


# ---- the step marker ---------------------------------------------------------------------------
def test_the_step_marker_is_a_no_op_outside_the_simulator():
    with step("decode", tokens=1):
        value = 1 + 1
    assert value == 2


@pytest.mark.parametrize("kwargs, says", [
    ({"tokens": 0}, "tokens=0"), ({"sequences": -1}, "sequences=-1"), ({"tokens": 1.5}, "positive integer"),
    ({"tokens": True}, "positive integer"),
])
def test_a_bad_step_count_is_named(kwargs, says):
    with pytest.raises(ValueError, match=says):
        with step("decode", **kwargs):
            pass


def test_a_step_without_a_name_is_named():
    with pytest.raises(ValueError, match="give the step's name"):
        with step(""):
            pass


STEPPED = """
import torch, torch.distributed as dist
from torch_neuronx.simulate import step
dist.init_process_group("neuron")
w = torch.ones(1024, 1024, dtype=torch.bfloat16, device="neuron")
x = torch.ones(16, 1024, dtype=torch.bfloat16, device="neuron")
with step("prefill", tokens=16):
    y = x @ w
    dist.all_reduce(y)
for _ in range(3):
    with step("decode", tokens=1):
        z = x[:1] @ w
        dist.all_reduce(z)
"""


def test_the_plan_times_each_marked_step_per_token(tmp_path, simulate):
    (tmp_path / "stepped.py").write_text(STEPPED)
    r, plan = simulate(tmp_path, "--nproc-per-node", "4", "--instance", "trn2.3xlarge", str(tmp_path / "stepped.py"))
    assert r.returncode == 0, r.stderr
    steps = plan["time"]["steps"]
    assert set(steps) == {"prefill", "decode"} and steps["decode"]["count"] == 3 and steps["prefill"]["count"] == 1
    profile = cost_model.profile_for("Trainium2", 2)
    cal = time_model.CALIBRATION
    mm = time_model.work_seconds(profile, "bf16", 2 * 16 * 1024 * 1024, (16 * 1024 + 1024 * 1024 + 16 * 1024) * 2)
    assert steps["prefill"]["compute_seconds"] == pytest.approx(mm)
    assert steps["prefill"]["eager_launches"] == 1  # one mm tile of 16 rows (128-row tile)
    per_rank = hardware.INSTANCES["trn2.3xlarge"].links.chip_bytes_per_s / 4
    latency, transfer = time_model.collective_seconds("all_reduce", 16 * 1024 * 2, 4, per_rank, "on chip (assumed)",
                                                      "Trainium2")
    assert steps["prefill"]["communication_seconds"] == pytest.approx(latency + transfer)
    assert steps["prefill"]["communication_fixed_seconds"] == pytest.approx(cal.collective_s)
    estimate = mm + cal.eager_launch_s + latency + transfer
    assert steps["prefill"]["seconds"] == pytest.approx(estimate)
    assert steps["prefill"]["interval_seconds"] == pytest.approx(list(cal.interval(estimate)))
    assert steps["prefill"]["bounds_seconds"] == pytest.approx([max(mm + cal.eager_launch_s, latency + transfer),
                                                                estimate])
    assert steps["prefill"]["per_token_seconds"] == pytest.approx(estimate / 16)
    assert steps["prefill"]["tokens_per_second"] == pytest.approx(16 / estimate)
    # A decode step's slice and matmul, the same each step: the mean is one step's time.
    assert steps["decode"]["per_token_seconds"] == steps["decode"]["seconds"]
    whole = plan["ranks"][0]["step_seconds"]
    assert whole >= estimate + 3 * steps["decode"]["seconds"] - 1e-12
    assert plan["time"]["step_seconds"] == whole and plan["time"]["interval_seconds"] == list(cal.interval(whole))
    text = (tmp_path / "plan" / "plan.txt").read_text()
    assert text.splitlines()[1].startswith("time on 1 x trn2.3xlarge (LNC=2), an estimate:")
    assert "step 'decode' x 3:" in text and "per token" in text


def test_steps_do_not_nest(tmp_path, simulate):
    (tmp_path / "nested.py").write_text(
        "import torch\nfrom torch_neuronx.simulate import step\nwith step('train'):\n    with step('inner'):\n"
        "        torch.ones(2, device='neuron')\n")
    r, plan = simulate(tmp_path, str(tmp_path / "nested.py"))
    assert r.returncode == 1 and "steps do not nest" in r.stderr and "nested.py:4" in r.stderr


# ---- what-if: --recost --------------------------------------------------------------------------
def test_recost_equals_a_fresh_run_on_the_other_instance(tmp_path, simulate):
    (tmp_path / "stepped.py").write_text(STEPPED)
    program = str(tmp_path / "stepped.py")
    r, trn2 = simulate(tmp_path / "a", "--nproc-per-node", "4", "--instance", "trn2.3xlarge", program)
    assert r.returncode == 0, r.stderr
    r, recosted = simulate(tmp_path / "b", "--recost", str(tmp_path / "a" / "plan" / "plan.json"),
                           "--instance", "trn3-gen1", "--lnc", "1")
    assert r.returncode == 0, r.stderr
    r, fresh = simulate(tmp_path / "c", "--nproc-per-node", "4", "--instance", "trn3-gen1", "--lnc", "1", program)
    assert r.returncode == 0, r.stderr
    assert recosted["instance"] == "trn3-gen1" and recosted["lnc"] == 1
    assert recosted["time"] == fresh["time"] and recosted["time"] != trn2["time"]
    assert [x["step_seconds"] for x in recosted["ranks"]] == [x["step_seconds"] for x in fresh["ranks"]]
    assert recosted["capacity_bytes"] == hardware.CHIPS["Trainium3"].core_memory(1)
    assert "re-costed from" in (tmp_path / "b" / "plan" / "plan.txt").read_text()


def test_recost_reads_a_plan_of_the_schema_before(tmp_path, simulate):
    """tests/data/plan_schema2_stepped.json: STEPPED's plan on a trn2.3xlarge as the simulator wrote it
    before one estimate per step (schema 2: a [low, high] range). Re-costed, it gives the plan a fresh
    run gives now."""
    old = os.path.join(os.path.dirname(__file__), "data", "plan_schema2_stepped.json")
    with open(old) as f:
        assert json.load(f)["schema"] == 2
    r, recosted = simulate(tmp_path / "a", "--recost", old, "--instance", "trn2.3xlarge")
    assert r.returncode == 0, r.stderr
    (tmp_path / "stepped.py").write_text(STEPPED)
    r, fresh = simulate(tmp_path / "b", "--nproc-per-node", "4", "--instance", "trn2.3xlarge", str(tmp_path / "stepped.py"))
    assert r.returncode == 0, r.stderr
    assert recosted["schema"] == fresh["schema"] == 3 and recosted["simulation"]["recorded_schema"] == 2
    assert recosted["time"] == fresh["time"]
    assert isinstance(recosted["time"]["steps"]["decode"]["per_token_seconds"], float)


def test_recost_refuses_what_it_cannot_re_cost(tmp_path, simulate):
    (tmp_path / "old.json").write_text(json.dumps({"schema": 1, "mode": "structure", "nproc_per_node": 1}))
    r, _ = simulate(tmp_path, "--recost", str(tmp_path / "old.json"))
    assert r.returncode == 2 and "is not a plan this version can re-cost" in r.stderr
    assert "schema 1" in r.stderr and "schema 2 or 3" in r.stderr and "run the simulation again" in r.stderr
    (tmp_path / "bad.json").write_text("{not json")
    r, _ = simulate(tmp_path, "--recost", str(tmp_path / "bad.json"))
    assert r.returncode == 2 and "cannot read the plan" in r.stderr


# ---- a whole fleet -----------------------------------------------------------------------------
def test_a_1024_rank_plan_is_grouped_and_small(tmp_path, simulate):
    r, plan = simulate(tmp_path, "--nproc-per-node", "64", "--nnodes", "16", "--instance", "trn2.48xlarge",
                       os.path.join(PROGRAMS, "tp_mlp.py"), env={"MLP_HIDDEN": "256"})
    assert r.returncode == 0, r.stderr
    assert plan["world_size"] == 1024 and plan["simulation"]["script_runs"] == 2
    assert all(rank["step_seconds"] == plan["ranks"][0]["step_seconds"] for rank in plan["ranks"])
    assert plan["ranks"][0]["communication_seconds"] > 0 and plan["groups"][0]["link"] == "EFA"
    text = (tmp_path / "plan" / "plan.txt").read_text()
    table = text[text.index("time per run"):text.index("rank 0's collectives")].strip().splitlines()
    assert len(table) == 2 and table[1].split()[0] == "0-1023", table
    assert os.path.getsize(tmp_path / "plan" / "plan.json") < 2_000_000


# ---- one program, one time ------------------------------------------------------------------------
@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_the_report_and_the_one_device_plan_give_a_program_the_same_time(tmp_path, simulate):
    program = os.path.join(PROGRAMS, "one_device_flux2.py")
    run = subprocess.run([sys.executable, "-m", "torch_neuronx.run", "--output-dir", str(tmp_path / "report"), program],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TORCH_NEURONX_INSTANCE_TYPE": "trn2.3xlarge"})
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    r, plan = simulate(tmp_path, "--instance", "trn2.3xlarge", program)
    assert r.returncode == 0, r.stderr
    # The same model; the op lists differ only where fake tensors see a composite the device splits
    # (stack for cat, clone for copy_): well under a percent.
    assert plan["ranks"][0]["step_seconds"] == pytest.approx(report["steady_state_seconds"], rel=0.01)
    assert plan["ranks"][0]["step_interval_seconds"] == pytest.approx(report["steady_state_interval_seconds"],
                                                                      rel=0.01)
    assert plan["ranks"][0]["eager_launches"] + plan["ranks"][0]["graph_launches"] == sum(
        n["launches"] for n in report["neffs"])
    assert math.isclose(plan["ranks"][0]["steps"]["compiled"]["compute_seconds"],
                        report["compiled_graphs"][0]["estimated_ms_per_call"] / 1e3, rel_tol=1e-9)


ATTENTION = """
import torch, torch.nn.functional as F
from torch_neuronx.simulate import step
q = torch.ones(1, 2, {length}, 64, dtype=torch.bfloat16, device="neuron", requires_grad=True)
f = torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True).sum(), backend="neuron",
                  fullgraph=True)
with step("train"):
    f(q).backward()
"""


@pytest.mark.parametrize("length, flash", [(1024, True), (1000, False)])
def test_compiled_attention_takes_the_nki_flash_kernel_where_torchneuron_would(tmp_path, simulate, length, flash):
    """Lengths multiples of 512: TorchNeuron's compiler calls its flash kernel, and the scores never reach
    HBM; otherwise its plain decomposition saves them for the backward (a graph output, then an input)."""
    (tmp_path / "attention.py").write_text(ATTENTION.format(length=length))
    r, plan = simulate(tmp_path, str(tmp_path / "attention.py"))
    assert r.returncode == 0, r.stderr
    items = [i for s in plan["recorded"]["0"]["work"] if s["step"] == "train" for i in s["items"]]
    scores = 2 * length * length * 4  # two heads' fp32 scores: the plain decomposition's saved tensors
    moved = sum(b * n for _, _, b, n in items)
    assert (moved < scores) == flash, (moved, scores)


# ---- collectives in a compiled graph that run under its independent compute ----------------------
TINY = ["--layers", "2", "--hidden", "256", "--ffn", "512", "--heads", "8", "--kv-heads", "4", "--vocab", "1024"]


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it; make test stays under 10 minutes)
def test_a_backwards_reduce_scatter_runs_under_the_weight_gradients_and_tp_decode_hides_nothing(tmp_path, simulate):
    """Sequence-parallel training: each compiled block's backward reduce-scatters its input gradient,
    which no weight gradient needs, so those matmuls hide it. Decode: each all-reduce's result feeds
    the next matmul, so nothing hides."""
    args = ("--nproc-per-node", "4", "--instance", "trn2.3xlarge")
    r, train = simulate(tmp_path / "train", *args, os.path.join(PROGRAMS, "llama_train_tp_dp.py"), *TINY,
                        "--seq", "512", "--global-batch", "2", "--tp", "4", "--sequence-parallel")
    assert r.returncode == 0, r.stderr
    step = train["time"]["steps"]["train"]
    assert 0 < step["communication_hidden_seconds"] < step["communication_seconds"]
    graphs = {g["graph"] for g in train["recorded"]["0"]["graph_overlaps"]}
    assert any(g.endswith(".backward") for g in graphs), graphs
    assert step["seconds"] == pytest.approx(step["compute_seconds"] + step["launch_seconds"] + step[
        "communication_seconds"] - step["communication_hidden_seconds"])
    r, decode = simulate(tmp_path / "decode", *args, os.path.join(PROGRAMS, "llama_decode_tp.py"), *TINY,
                         "--prompt", "128", "--new-tokens", "4")
    assert r.returncode == 0, r.stderr
    step = decode["time"]["steps"]["decode"]
    assert step["communication_hidden_seconds"] <= 1e-6 * step["communication_seconds"]
