"""The `neuron` process group under torchrun (the rest of issue 5 builds on this)."""
import os

import pytest

from isolated import run

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize("backend, reported", [("neuron", "neuron"), ("", "undefined")])
def test_collectives_across_two_ranks_under_torchrun(tmp_path, backend, reported):
    # backend "": init_process_group() without one, as when neuron is the accelerator.
    script = os.path.join(HERE, "distributed", "collectives_on_two_ranks.py")
    r = run(f"import sys, runpy; sys.argv = ['torchrun', '--nproc_per_node=2', '--rdzv-endpoint=localhost:0', "
            f"'--rdzv-backend=c10d', {script!r}]; runpy.run_module('torch.distributed.run', run_name='__main__')",
            PG_BACKEND=backend, RESULT_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == [f"0 {reported}", f"1 {reported}"]


def test_more_ranks_than_cores_is_a_clear_error():
    r = run("""
        import os, torch, torch.distributed as dist
        os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="5", RANK="0", WORLD_SIZE="1")
        try:
            dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
        except Exception as error:
            print(error)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torchrun started 5 processes on this node, but an emulated trn2.3xlarge (LNC=2) has 4" in r.stdout
