"""A parallelize_module + torch.compile(backend="neuron") program under torchrun: its graphs (DTensor
inputs, unwrapped by AOTAutograd into this rank's plain forward and backward) train with the eager
run's losses, and each rank's report lists them, their calls and their lowering, as for any graph;
under the xla executor too, which runs each graph as XLA:CPU programs between its collectives."""
import json
import textwrap

import pytest

from helpers import isolated

SCRIPT = """
    import json, os, sys, warnings, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
    from torch_neuronx import diagnostics

    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    out_dir, steps = sys.argv[1], 3

    def build():
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("neuron")
        return parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

    def train(model, run):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(steps):
            loss = run(torch.ones(6, 8, device="neuron")).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    model = build()
    eager = train(model, model)
    model = build()
    diagnostics.start()
    compiled = train(model, torch.compile(model, backend="neuron"))
    report = diagnostics.report("Trainium2:2")
    diagnostics.stop()
    graphs = [{k: getattr(g, k) for k in ("name", "calls", "parts")} for g in report.compiled_graphs]
    failing = [f.kind for f in report.findings if f.severity == "would-fail"]
    torch._dynamo.reset()
    model = build()
    diagnostics.start()
    xla = train(model, torch.compile(model, backend="neuron", options={"executor": "xla"}))
    xla_graphs = [{k: getattr(g, k) for k in ("name", "calls", "parts")} for g in diagnostics.report("Trainium2:2").compiled_graphs]
    diagnostics.stop()
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"eager": eager, "compiled": compiled, "graphs": graphs, "failing": failing, "xla": xla,
                   "xla_graphs": xla_graphs}, f)
    dist.destroy_process_group()
"""


@pytest.mark.long  # two torchrun ranks compiling: make test-long (CI runs it)
def test_a_compiled_tensor_parallel_mlp_trains_like_eager_and_is_reported(tmp_path):
    script = tmp_path / "tp_train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    r = isolated.torchrun(str(script), 2, str(tmp_path), TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"))
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["compiled"] == pytest.approx(result["eager"], rel=1e-5, abs=1e-7), result
        assert result["compiled"][0] > result["compiled"][-1]  # it trained
        forward, backward = sorted(result["graphs"], key=lambda g: g["name"])
        assert (forward["calls"], forward["parts"]) == (3, {"forward": "lowered"}), result["graphs"]
        assert backward["name"] == forward["name"] + ".backward"
        assert (backward["calls"], backward["parts"]) == (3, {"backward": "lowered"}), result["graphs"]
        assert result["failing"] == [], result["failing"]
        # the xla executor: XLA:CPU programs between the collectives, TorchNeuron's arithmetic
        assert result["xla"] == pytest.approx(result["eager"], rel=1e-5, abs=1e-7), result
        shape = [(g["calls"], g["parts"]) for g in sorted(result["graphs"], key=lambda g: g["name"])]
        assert [(g["calls"], g["parts"]) for g in sorted(result["xla_graphs"], key=lambda g: g["name"])] == shape
