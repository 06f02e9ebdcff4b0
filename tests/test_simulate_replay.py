"""A compiled graph called again with the same inputs replays its first call's record
(simulate/replay.py) instead of running its ops on fake tensors again: the plan must be the one
every call runs for, byte for byte (work, launches, collectives, peak, allocations), for a decode
loop (a static KV cache updated in place, a collective in the graph) and for a training loop (a
compiled block's forward and backward)."""
import pytest

DECODE = """
import torch, torch.distributed as dist
import torch_neuronx.simulate.compiled as compiled; compiled.REPLAY = {replay}
from torch_neuronx.simulate import step
dist.init_process_group("neuron")
group = dist.group.WORLD
w = torch.randn(256, 256, device="neuron")
cache = torch.zeros(64, 256, device="neuron")

def forward(x, pos):
    cache.index_copy_(0, pos, x)
    y = torch.relu(x @ w) + cache.sum(0)  # an intermediate the size of the cache, then gone
    out = torch.ops._c10d_functional.all_reduce(y, "sum", group.group_name)
    return torch.ops._c10d_functional.wait_tensor(out)

forward = torch.compile(forward, backend="neuron", fullgraph=True, dynamic=False)
x, pos = torch.randn(4, 256, device="neuron"), torch.arange(4, device="neuron")
with step("prefill", tokens=4):
    x = forward(x, pos)
pos = torch.tensor([4], device="neuron")
for _ in range({steps}):
    with step("decode", tokens=1):
        y = forward(x[:1], pos)
    pos = pos + 1
"""

TRAIN = """
import torch
import torch_neuronx.simulate.compiled as compiled; compiled.REPLAY = {replay}
from torch_neuronx.simulate import step
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(128, 512), torch.nn.Linear(512, 128)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))

block = Block().to("neuron")
block.compile(backend="neuron", fullgraph=True, dynamic=False)
opt = torch.optim.SGD(block.parameters(), lr=0.1)
for _ in range({steps}):
    with step("train", sequences=8):
        for _ in range(3):
            block(torch.randn(8, 128, device="neuron")).square().mean().backward()
        opt.step()
        opt.zero_grad()
"""


def _plan(simulate, tmp_path, program, replay, steps, *args):
    (tmp_path / str(replay)).mkdir(parents=True)
    path = tmp_path / str(replay) / "program.py"  # one name: the plan names the program's lines
    path.write_text(program.format(replay=replay, steps=steps))
    r, plan = simulate(tmp_path / str(replay), *args, str(path))
    assert r.returncode == 0, r.stderr
    for key in ("script", "simulation"):
        plan.pop(key)
    return plan


@pytest.mark.parametrize("program, args", [(DECODE, ("--nproc-per-node", "2", "--instance", "trn2.3xlarge")),
                                           (TRAIN, ())], ids=["decode", "train"])
def test_a_replayed_graph_plans_as_one_run_every_call(tmp_path, simulate, program, args):
    replayed = _plan(simulate, tmp_path, program, True, 6, *args)
    run = _plan(simulate, tmp_path, program, False, 6, *args)
    assert replayed == run
    recorded = replayed["recorded"]["0"]["launches"]
    assert sum(s["items"]["graph"] for s in recorded) > 6  # the graphs were called, and counted, every step


def test_every_decode_step_replays_the_same_cost(tmp_path, simulate):
    args = ("--nproc-per-node", "2", "--instance", "trn2.3xlarge")
    few, many = (_plan(simulate, tmp_path / str(n), DECODE, True, n, *args) for n in (2, 40))
    decode = [p["time"]["steps"]["decode"] for p in (few, many)]
    assert (decode[0]["count"], decode[1]["count"]) == (2, 40)
    # The same per token, but for the rounding of 40 calls' sum divided by 40 against 2's by 2.
    assert decode[0]["per_token_seconds"] == pytest.approx(decode[1]["per_token_seconds"], rel=1e-12)
    assert many["ranks"][0]["collective_calls"] - few["ranks"][0]["collective_calls"] == 38
