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
