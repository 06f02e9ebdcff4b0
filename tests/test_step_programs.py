"""The step-marked simulator programs (tests/programs/simulate/llama_decode_tp.py and
llama_train_tp_dp.py) run for real on one neuron device, without torchrun (world size 1), at tiny
sizes: the decode program's greedy tokens are the same eager and compiled, and the training
program's loss falls over three steps (tp 1, dp 1: ZeRO-1's collectives over one rank), the same
with activation checkpointing."""
import ast
import os
import subprocess
import sys

import pytest

PROGRAMS = os.path.join(os.path.dirname(__file__), "programs", "simulate")
TINY = ["--layers", "2", "--hidden", "64", "--ffn", "128", "--heads", "4", "--kv-heads", "2", "--vocab", "100"]
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def run(tmp_path, program, *args):
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN}
    r = subprocess.run([sys.executable, os.path.join(PROGRAMS, program), *TINY, *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def generated(stdout):
    line = next(line for line in stdout.splitlines() if line.startswith("generated token ids:"))
    return ast.literal_eval(line.split(":", 1)[1].strip())


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_decode_eager_and_compiled_generate_the_same_tokens(tmp_path):
    args = ["--prompt", "8", "--new-tokens", "3"]
    eager = generated(run(tmp_path, "llama_decode_tp.py", *args, "--eager"))
    compiled = generated(run(tmp_path, "llama_decode_tp.py", *args))  # the default: torch.compile(backend="neuron")
    assert len(eager) == 1 and len(eager[0]) == 3 and all(0 <= t < 100 for t in eager[0])
    assert compiled == eager


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_train_loss_decreases(tmp_path):
    args = ["--seq", "16", "--global-batch", "2", "--tp", "1", "--steps", "3", "--lr", "1e-2", "--eager"]
    losses = []
    for extra in ([], ["--checkpoint"]):
        out = run(tmp_path, "llama_train_tp_dp.py", *args, *extra)
        losses.append([float(line.split()[-1]) for line in out.splitlines() if line.startswith("step ")])
    plain, checkpointed = losses
    assert len(plain) == 3 and plain[0] > plain[1] > plain[2], plain
    assert checkpointed == plain  # activation checkpointing recomputes the same forward
