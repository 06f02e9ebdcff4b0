"""Short processes that use neuron exit with status 0, whatever they did last.

What this guards against is a race at shutdown: a thread that releases autograd's graph after the
interpreter has begun shutting down aborts the process ("terminate called without an active
exception", status 134), and only in some runs. Each kind below is a program a user or a CI job
runs and ends right after its last neuron call; every run of each must exit 0.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.isolated import environment

PROGRAMS = {
    "backward": """
        import torch
        m = torch.nn.Linear(8, 8).to("neuron")
        m(torch.randn(4, 8, device="neuron")).sum().backward()
        assert m.weight.grad.device.type == "neuron"
    """,
    "custom_function_backward": """
        import torch
        class Twice(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2
            @staticmethod
            def backward(ctx, grad):
                return grad * 2
        x = torch.randn(16, device="neuron", requires_grad=True)
        Twice.apply(x).sum().backward()
        assert float(x.grad.sum()) == 32.0
    """,
    "autocast_backward": """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to("neuron")
        with torch.autocast("neuron"):
            y = m(torch.randn(4, 8, device="neuron"))
        assert y.dtype == torch.float16
        y.float().sum().backward()
    """,
    "optimizer_step": """
        import torch
        m = torch.nn.Linear(8, 8).to("neuron")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(2):
            opt.zero_grad()
            m(torch.randn(4, 8, device="neuron")).pow(2).mean().backward()
            opt.step()
    """,
    "compiled_training": """
        import torch
        m = torch.nn.Linear(8, 8).to("neuron")
        step = torch.compile(lambda x: m(x).relu().sum(), backend="neuron")
        step(torch.randn(4, 8, device="neuron")).backward()
        assert m.weight.grad is not None
    """,
}

# Each kind several times: a shutdown race loses in some runs only, so one clean run proves little.
RUNS = {"backward": 6, "custom_function_backward": 3, "autocast_backward": 4, "optimizer_step": 4,
        "compiled_training": 2}


def _run(kind: str, env: dict) -> subprocess.CompletedProcess:
    code = "\n".join(line[8:] for line in PROGRAMS[kind].strip("\n").splitlines())
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
def test_short_neuron_processes_always_exit_zero(tmp_path):
    # One Inductor/NEFF cache for the compiled runs: the first compiles, the second loads.
    env = environment(TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"),
                      TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), OMP_NUM_THREADS="1")
    kinds = [kind for kind, count in RUNS.items() for _ in range(count)]
    assert len(kinds) >= 19
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda kind: (kind, _run(kind, env)), kinds))
    failed = [f"{kind}: exit {r.returncode}: {r.stderr.strip()[-600:]}" for kind, r in results if r.returncode != 0]
    assert not failed, "\n".join(failed)


def test_torchrun_workers_exit_zero_after_backward(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group(backend='neuron')\n"
        "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8).to('neuron'))\n"
        "m(torch.randn(4, 8, device='neuron')).sum().backward()\n"
        "dist.destroy_process_group()\n")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", str(script)],
                       env=environment(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("threaded", [False, True])
def test_backward_runs_on_the_callers_thread_as_on_cpu(threaded):
    # CPU's backward runs on the thread that called it; neuron's does too (no device thread).
    import threading

    import torch

    seen = []

    class Record(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(threading.get_ident())
            return grad

    def train(device):
        x = torch.ones(4, device=device, requires_grad=True)
        Record.apply(x).sum().backward()
        seen.append(("caller", threading.get_ident()))

    for device in ("cpu", "neuron"):
        if threaded:
            worker = threading.Thread(target=train, args=(device,))
            worker.start()
            worker.join()
        else:
            train(device)
    cpu_node, (_, cpu_caller), neuron_node, (_, neuron_caller) = seen
    assert cpu_node == cpu_caller and neuron_node == neuron_caller
    assert torch.autograd.is_multithreading_enabled()  # the user's setting is left as it was
