"""Functional collectives inside compiled graphs (as tensor-parallel graphs contain them), across
two ranks of a Gloo process group, each on its own neuron device."""
import textwrap

import pytest

from helpers.isolated import run

SCRIPT = """
    import os, sys, torch, torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.multiprocessing as mp

    def worker(rank, store_path):
        torch.neuron.set_device(rank)
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
        def step(x, w):
            partial = x @ w                                   # a row-parallel matmul's partial sum
            total = funcol.all_reduce(partial, "sum", dist.group.WORLD)
            return torch.relu(total) + 1
        torch.manual_seed(0)
        x, w = torch.randn(4, 8), torch.randn(8, 3)
        shard = slice(4 * rank, 4 * rank + 4)
        compiled = torch.compile(step, backend="neuron", fullgraph=True)
        out = compiled(x[:, shard].to("neuron"), w[shard].to("neuron"))
        expected = torch.relu(x @ w) + 1
        from torch_neuronx import neuron_dynamo_backend as backend
        assert out.device == torch.device("neuron", rank), out.device
        assert backend.get_dynamo_metrics()[0]["has_collectives"]
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(sys.argv[1],), nprocs=2)
        print("OK")
"""


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_compiled_all_reduce_across_two_ranks(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(textwrap.dedent(SCRIPT))
    r = run(f"import runpy, sys; sys.argv = ['two_ranks', {str(tmp_path / 'store')!r}]; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')",
            TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("OK")


READINESS_SCRIPT = """
    import os, sys, torch, torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch_neuronx import diagnostics

    dist.init_process_group("neuron")
    rank, broadcast = dist.get_rank(), sys.argv[1] == "broadcast"

    class RowParallel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = funcol.all_reduce(self.lin(x), "sum", dist.group.WORLD)
            g = funcol.all_gather_tensor(y, 0, dist.group.WORLD)
            y = funcol.reduce_scatter_tensor(g, "sum", 0, dist.group.WORLD)
            if broadcast:
                y = funcol.broadcast(y, 0, dist.group.WORLD)  # BROADCAST LINE
            return y * 2

    torch.manual_seed(0)
    model = RowParallel().to("neuron")
    x = torch.randn(4, 8).to("neuron")
    diagnostics.start()
    out = torch.compile(model, backend="neuron", fullgraph=True)(x)
    out.sum().backward()
    report = diagnostics.report("Trainium2:2")
    diagnostics.stop()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    eager = model(x)
    eager.sum().backward()
    torch.testing.assert_close(out.cpu(), eager.cpu())
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got.cpu(), p.grad.cpu())
    failing = [(f.kind, list(f.ops), f.site) for f in report.findings if f.severity == "would-fail"]
    with open(os.path.join(sys.argv[2], f"findings-{rank}"), "w") as out_file:
        out_file.write(repr(failing))
    dist.destroy_process_group()
"""


@pytest.mark.long  # two torchrun ranks compiling: make test-long (CI runs it)
@pytest.mark.parametrize("executor", ["inductor", "xla"])
@pytest.mark.parametrize("variant", ["legalized", "broadcast"])
def test_compiled_collectives_train_like_eager_and_only_broadcast_would_fail(tmp_path, variant, executor):
    """TorchNeuron lowers all_reduce, all_gather and reduce_scatter in a graph (CollectiveLegalization),
    not broadcast; the backward graph's collectives run as the forward's do. The xla executor runs the
    graph as XLA:CPU programs between its collectives, and refuses broadcast at its line, as
    TorchNeuron's compile fails there."""
    from helpers import isolated

    script = tmp_path / "row_parallel.py"
    script.write_text(textwrap.dedent(READINESS_SCRIPT))
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "BROADCAST LINE" in text)
    r = isolated.torchrun(str(script), 2, variant, str(tmp_path), TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"),
                          TORCH_NEURONX_COMPILE_EXECUTOR=executor)
    if executor == "xla" and variant == "broadcast":
        assert r.returncode != 0
        assert f"_c10d_functional.broadcast.default (at {script}:{line} " in r.stderr, r.stderr[-3000:]
        return
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in range(2):
        text = (tmp_path / f"findings-{rank}").read_text()
        if variant == "legalized":
            assert text == "[]", (rank, text)
        else:
            assert text == f"[('stablehlo-lowering', ['_c10d_functional.broadcast'], '{script}:{line}')]", text
