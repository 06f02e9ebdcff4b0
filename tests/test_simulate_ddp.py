"""DDP under the plan simulator, against the same program run for real under torchrun (the oracle):
tests/programs/simulate/ddp_train.py, the CUDA idiom (set_device(LOCAL_RANK), "neuron:<local rank>",
DDP(device_ids=[local_rank])). The plan's buckets are DDP's own as torchrun builds and rebuilds
them, its peak the real run's, --numerics gives the real run's losses; the overlap of the buckets'
all-reduces with the backward is checked by hand."""
import os

import pytest
import torch

from helpers.isolated import torchrun
from torch_neuronx.trainium import time_model

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "simulate", "ddp_train.py")


def line_of(marker):
    with open(PROGRAM) as f:
        return "ddp_train.py:" + str(next(i for i, text in enumerate(f, 1) if marker in text))


def real_run(tmp_path, ranks, *options):
    """Rank 0's results of the program under torchrun: losses, weights, DDP's bucket sizes, peak."""
    tmp_path.mkdir(exist_ok=True)
    r = torchrun(PROGRAM, ranks, *options, RESULT_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr[-4000:]
    return torch.load(tmp_path / "rank0.pt")


def simulated(tmp_path, simulate, ranks, *options, mode=(), program=PROGRAM):
    r, plan = simulate(tmp_path, *mode, "--nproc-per-node", str(ranks), "--instance", "trn2.3xlarge", program,
                       *options)
    assert r.returncode == 0, r.stderr[-4000:]
    return plan


@pytest.mark.parametrize("options", [["--bucket-cap-mb", "0.005"],
                                     pytest.param(["--gradient-as-bucket-view"], marks=pytest.mark.long)])
def test_the_plan_has_ddps_buckets_and_peak_as_torchrun_runs_them(tmp_path, simulate, options):
    """Construction (its two all_gathers of the parameters' shapes and the broadcast of their values),
    each backward's bucket all-reduces at the loss.backward() line, in the sizes DDP built (first
    backward) and rebuilt (after it): those torchrun's DDP logs; the peak the real run's."""
    real = real_run(tmp_path / "real", 2, *options)
    plan = simulated(tmp_path / "plan", simulate, 2, *options)
    rank = plan["ranks"][0]
    made = [(c["op"], c["shapes"]) for c in rank["collectives"] if c["line"] == line_of("ddp = DDP(")]
    # 8 parameters (4 weights, 4 biases): their count, then 2 x 12 dimensions' sizes and strides
    assert made == [("all_gather", "int64[1]"), ("all_gather", "int64[24]"),
                    ("broadcast", f"float32[{real['weights'].numel()}]")]
    backwards = plan["time"]["backward_overlap"]
    built, rebuilt = real["bucket_sizes"]
    assert [[c["bytes"] for c in b["calls"]] for b in backwards] == [built, rebuilt, rebuilt]
    assert {c["line"] for b in backwards for c in b["calls"]} == {line_of("loss.backward()")}
    # The real run's peak can be one set of gradients higher: Gloo's worker thread drops a finished
    # bucket's tensors when it gets to it, which under load can be after the next allocation.
    assert 0 <= real["peak_bytes"] - rank["peak_bytes"] <= 4 * real["weights"].numel() + 512 * 8, \
        (real["peak_bytes"], rank["peak_bytes"])


@pytest.mark.parametrize("hook, dtype", [("fp16", "float16"), ("bf16-wrapped", "bfloat16")])
def test_a_compressing_comm_hook_all_reduces_half_the_bytes(tmp_path, simulate, hook, dtype):
    plan = simulated(tmp_path, simulate, 2, "--hook", hook)
    reduced = [c for c in plan["ranks"][0]["collectives"] if c["line"] == line_of("loss.backward()")]
    params = 3 * (32 * 32 + 32) + 33
    assert [(c["shapes"], c["bytes"], c["calls"]) for c in reduced] == [(f"{dtype}[{params}]", 2 * params, 3)]


@pytest.mark.long  # a torchrun run beside the plan: make test-long (CI runs it; make test stays under 10 minutes)
def test_bf16_compress_hook_is_refused_as_torchs_ddp_refuses_it_off_cuda(tmp_path, simulate):
    """DDP registers bf16_compress_hook only with CUDA and NCCL or XPU (its _check_comm_hook): on
    neuron under torchrun, on Trainium and in the simulator alike."""
    real = torchrun(PROGRAM, 2, "--hook", "bf16")
    r, plan = simulate(tmp_path, "--nproc-per-node", "2", "--instance", "trn2.3xlarge", PROGRAM, "--hook", "bf16")
    words = "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL"
    assert real.returncode != 0 and words in real.stderr
    assert r.returncode == 1 and words in r.stderr
    assert plan["ranks"][0]["error"]["line"] == line_of("getattr(default_hooks")


def test_no_sync_steps_reduce_only_on_the_last_micro_batch_and_static_graph_runs(tmp_path, simulate):
    accumulate = simulated(tmp_path / "accumulate", simulate, 2, "--accumulate", "2")
    assert len(accumulate["time"]["backward_overlap"]) == 3  # 6 backwards, 3 of them under no_sync()
    static = simulated(tmp_path / "static", simulate, 2, "--static-graph")
    calls = [(c["shapes"], c["calls"]) for c in static["ranks"][0]["collectives"]
             if c["line"] == line_of("loss.backward()")]
    # static_graph's first backward all-reduces which parameters were used, and its bucket at the end
    assert calls == [("int32[8]", 1), ("float32[3201]", 3)]


def test_the_buckets_run_under_the_rest_of_the_backward(tmp_path, simulate):
    """Each bucket's all-reduce starts when it is launched, after the one before: what runs past the
    backward's end is all that adds to the step's estimate."""
    assert time_model.overlapped_seconds([(2.0, 5.0), (2.0, 1.0)]) == 3.0  # ends 1 s after the compute
    assert time_model.overlapped_seconds([(1.0, 0.0)]) == 0.0
    plan = simulated(tmp_path, simulate, 2, "--bucket-cap-mb", "0.005")
    rank = plan["ranks"][0]
    rebuilt = plan["time"]["backward_overlap"][1]
    first, last = rebuilt["calls"]
    assert first["compute_after_seconds"] > last["compute_after_seconds"] >= 0
    assert rebuilt["hidden_seconds"] + rebuilt["exposed_seconds"] == pytest.approx(first["seconds"] + last["seconds"])
    assert rebuilt["hidden_seconds"] == pytest.approx(
        time_model.overlapped_seconds([(c["seconds"], c["compute_after_seconds"]) for c in rebuilt["calls"]]))
    hidden = sum(b["hidden_seconds"] for b in plan["time"]["backward_overlap"])
    assert hidden > 0 and rank["communication_hidden_seconds"] == pytest.approx(hidden)
    estimate = rank["compute_seconds"] + rank["launch_seconds"] + rank["communication_seconds"] - hidden
    assert rank["step_seconds"] == pytest.approx(estimate)
    assert rank["step_bounds_seconds"][1] == pytest.approx(estimate + hidden)  # none hidden: a bound


@pytest.mark.long  # a torchrun run beside the plan: make test-long (CI runs it; make test stays under 10 minutes)
def test_numerics_give_the_losses_of_a_torchrun_run(tmp_path, simulate):
    """--numerics on 4 ranks: each rank's slice of the batch (dist.get_rank() is each rank's own), DDP's
    averaged gradients; `losses` and `weights` equal one device's, and the losses are torchrun's."""
    real = real_run(tmp_path / "real", 4)
    plan = simulated(tmp_path / "plan", simulate, 4, mode=("--numerics", "--outputs", "losses,weights"))
    outputs = plan["numerics"]["outputs"]
    assert plan["numerics"]["ok"] and set(outputs) == {"losses", "weights"}
    for values in outputs["losses"]["values"]:
        torch.testing.assert_close(torch.tensor(values), real["losses"], rtol=1e-5, atol=1e-6)


def test_a_hard_coded_neuron_0_fails_on_ranks_1_to_3_naming_the_line(tmp_path, simulate):
    r, plan = simulate(tmp_path, "--all-ranks", "--nproc-per-node", "4", "--instance", "trn2.3xlarge", PROGRAM,
                       "--hard-coded-device")
    line = line_of("torch.neuron.set_device(")
    assert r.returncode == 1 and f"failed on ranks 1-3 at {line}: ValueError: Device index 0 is out of range" \
        in r.stderr, r.stderr
    assert ["error" in rank for rank in plan["ranks"]] == [False, True, True, True]


LLAMA = os.path.join(os.path.dirname(PROGRAM), "llama_tp_fsdp.py")
SMALL_LLAMA_DDP = ["--ddp", "--tp", "1", "--steps", "2", "--layers", "2", "--hidden", "64", "--ffn", "128", "--heads",
                   "4", "--kv-heads", "4", "--vocab", "256", "--seq", "16", "--batch", "2", "--dtype", "float32"]


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_a_llama_under_ddp_is_planned_from_two_ranks_and_equals_one_device(tmp_path, simulate):
    """The benchmark's program (a Llama-style decoder under DDP), small: it never uses its rank, so ranks 0
    and 3 run and the others are relabelled; each backward all-reduces every gradient's bytes (the first in
    one bucket: DDP knows the order only after it); --numerics equals one device."""
    plan = simulated(tmp_path / "plan", simulate, 4, *SMALL_LLAMA_DDP, program=LLAMA)
    assert plan["simulation"]["script_runs"] == 2 and plan["simulation"]["symmetry"]["used"]
    first, second = plan["time"]["backward_overlap"]
    params = 4 * (2 * 256 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64)  # float32: embedding, output, blocks, norm
    assert [c["bytes"] for c in first["calls"]] == [params] and sum(c["bytes"] for c in second["calls"]) == params
    numerics = simulated(tmp_path / "numerics", simulate, 4, *SMALL_LLAMA_DDP, program=LLAMA, mode=("--numerics",))
    assert numerics["numerics"]["ok"] and {"loss", "loss_after"} <= set(numerics["numerics"]["outputs"])
