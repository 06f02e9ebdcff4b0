"""FLUX.2-klein-4B at its real size (torch_neuronx.demo.real_size), the path the real-size benchmark
takes, at a reduced depth (one block and one text layer at the real widths, 2.3 GB): its configs,
saving and loading it, the seed's call on neuron against the same call on CPU over the same bytes,
and the refusals that come before a job which cannot fit this host."""
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from helpers.isolated import environment, run
from helpers.seed_examples import BENCHMARKS, ROOT, benchmark_module

REDUCED = "1,1,1"


@pytest.fixture(scope="module")
def reduced_path(tmp_path_factory):
    from torch_neuronx.demo import real_size

    return real_size.real_size_random_path(str(tmp_path_factory.mktemp("real") / "model"),
                                           depth=real_size.Depth(1, 1, 1))


def test_the_configs_are_the_checkpoints_counted_on_the_meta_device():
    from torch_neuronx.demo import real_size

    params = {name: n // 2 for name, n in real_size.checkpoint_bytes().items()}  # bf16
    # FLUX.2-klein-4B: a 3.88B transformer, Qwen3-4B (4.02B, its head tied to its embedding), the default VAE.
    assert round(params["transformer"] / 1e9, 2) == 3.88
    assert round(params["text_encoder"] / 1e9, 2) == 4.02
    assert 0.08e9 < params["vae"] < 0.09e9
    reduced = real_size.checkpoint_bytes(real_size.Depth(1, 1, 1))
    assert reduced["vae"] == params["vae"] * 2 and reduced["transformer"] < params["transformer"] * 2 / 6


def test_saving_is_once_and_whole(reduced_path):
    from torch_neuronx.demo import real_size

    saved = {name: os.path.isdir(os.path.join(reduced_path, name)) for name in
             ("text_encoder", "transformer", "vae", "tokenizer", "scheduler")}
    assert all(saved.values()), saved
    before = os.path.getmtime(os.path.join(reduced_path, "real_size.json"))
    assert real_size.real_size_random_path(reduced_path, depth=real_size.Depth(1, 1, 1)) == reduced_path
    assert os.path.getmtime(os.path.join(reduced_path, "real_size.json")) == before
    assert not [f for f in os.listdir(os.path.dirname(reduced_path)) if f.startswith(".staging-")]


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_eager_call_equals_cpu_on_the_same_bytes_and_hbm_counts_the_weights(reduced_path):
    parts = benchmark_module("real_size_parts")
    with torch.no_grad():
        peaks = parts.MemoryPeaks()
        gc.collect()  # an earlier test's cycles holding neuron tensors must not be freed mid-count
        before = torch.neuron.memory_allocated()
        neuron, record = parts.load_pipeline(reduced_path, peaks)
        assert record["neuron_allocated_bytes"] - before == record["weights_bytes"] > 2e9
        assert all(p.device.type == "neuron" for p in neuron.transformer.parameters())
        cpu = parts.host_twin_pipeline(neuron)
        assert torch.neuron.memory_allocated() - before == record["weights_bytes"]  # the twin copied nothing
        assert all(p.device.type == "cpu" for p in cpu.text_encoder.parameters())
        parts.narrow_cpu_like_neuron()
        timers = parts.PhaseTimes(neuron)
        # 32x32: bf16 convolutions crawl on hosts without AVX-512 (the benchmark test below says more)
        images = {name: parts.generate(pipe, 32, 1) for name, pipe in (("neuron", neuron), ("cpu", cpu))}
        phases = timers.take()
    assert [len(phases[p]) for p in parts.PHASES] == [1, 1, 1]
    assert images["cpu"].std() > 0.05 and np.array_equal(images["neuron"], images["cpu"])
    del neuron, cpu, timers
    gc.collect()  # the timed methods make cycles (pipeline -> bound method -> pipeline)
    assert torch.neuron.memory_allocated() == before


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_a_checkpoint_too_large_for_the_hosts_processes_is_refused_before_loading(reduced_path):
    from torch_neuronx.demo import pipelines
    from torch_neuronx.runtime import host_memory

    one = sum(pipelines._component_bytes(reduced_path).values())
    processes = host_memory.available_bytes() // one + 2
    # Copying every weight into each process (mapping the checkpoint's pages turned off).
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "eager_neuron.py"), "--model", reduced_path],
                       env=environment(LOCAL_WORLD_SIZE=str(processes), TORCH_NEURONX_MAP_CHECKPOINTS="0"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "HostMemoryError" in r.stderr, r.stderr[-3000:]
    message = r.stderr.strip().splitlines()[-1]
    assert f"in {processes} process(es) on this host" in message and "available" in message
    assert "torchrun --nproc_per_node" in message and "transformer" in message
    # Sharding the transformer over the ranks counts only a rank's part of it; the components loaded
    # whole stay in the checkpoint's pages, which the processes share: counted once.
    sizes = pipelines._component_bytes(reduced_path)
    check = f"from torch_neuronx.demo.pipelines import check_fits_host; check_fits_host({reduced_path!r}, ('transformer',))"
    for mapped, need in (("0", 2 * (one - sizes["transformer"] // 2)),
                         ("1", 2 * (sizes["transformer"] // 2) + one - sizes["transformer"])):
        r = run(check, LOCAL_WORLD_SIZE="2", WORLD_SIZE="2", TORCH_NEURONX_MAP_CHECKPOINTS=mapped)
        assert (r.returncode == 0) == (need < host_memory.available_bytes() * 0.9), (mapped, r.stderr)
    r = run(check.replace("('transformer',)", "()"), LOCAL_WORLD_SIZE=str(processes))
    assert r.returncode == (0 if one < host_memory.available_bytes() * 0.9 else 1), r.stderr


def test_a_disk_without_room_is_refused(tmp_path):
    from torch_neuronx.runtime import host_memory

    free = host_memory.shutil.disk_usage(tmp_path).free
    with pytest.raises(host_memory.HostMemoryError, match="of disk in .* free. To fix: point"):
        host_memory.require_disk(str(tmp_path), free + (1 << 30), "saving", "point it elsewhere")
    host_memory.require_disk(str(tmp_path), 1, "saving", "point it elsewhere")


def test_a_save_the_disk_cannot_hold_is_refused_and_leaves_nothing_behind(tmp_path, monkeypatch):
    from torch_neuronx.demo import real_size
    from torch_neuronx.runtime import host_memory

    free = host_memory.shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(real_size, "checkpoint_bytes", lambda depth: {"transformer": free + (1 << 30)})
    with pytest.raises(host_memory.HostMemoryError, match="of disk in .* free. To fix: point TMPDIR"):
        real_size.real_size_random_path(str(tmp_path / "pipeline"), depth=real_size.Depth(1, 1, 1))
    assert os.listdir(tmp_path) == []


def test_publishing_replaces_a_copy_an_interrupted_writer_left(tmp_path):
    from torch_neuronx.demo.publish import publish_once

    target = tmp_path / "pipeline"
    target.mkdir()
    (target / "half-written.safetensors").write_text("")  # no marker: a writer died here

    def write(staging):
        open(os.path.join(staging, "model_index.json"), "w").close()
    assert publish_once(str(target), "model_index.json", write) == str(target)
    assert sorted(os.listdir(target)) == ["model_index.json"] and os.listdir(tmp_path) == ["pipeline"]
    assert publish_once(str(target), "model_index.json", lambda staging: pytest.fail("written twice")) == str(target)


def test_a_neuron_block_larger_than_the_host_is_an_error_not_an_oom_kill():
    # A device larger than the host: the emulated capacity would allow the block, the host cannot back it.
    r = run("""
        import torch
        from torch_neuronx.runtime import host_memory
        too_much = host_memory.available_bytes() + (1 << 30)
        try:
            torch.empty(too_much, dtype=torch.uint8, device="neuron")
        except torch.OutOfMemoryError as error:
            print("OOM", "The host itself ran out of memory first (the host has" in str(error),
                  "run fewer ranks on this host" in str(error))
        print(torch.neuron.memory_allocated(), torch.neuron.memory_stats()["num_ooms"])
        print(torch.ones(1 << 24, device="neuron").sum().item())
    """, TORCH_NEURONX_DEVICE_MEMORY="4TiB")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["OOM True True", "0 1", f"{float(1 << 24)}"], r.stdout


@pytest.mark.long  # five child processes, three compiles and torchrun: make test-long (CI runs it)
def test_the_benchmark_runs_each_part_at_a_reduced_depth(tmp_path):
    # A 32x32 image: on a host without AVX-512, CPU's bf16 convolution (the VAE's, on CPU and neuron
    # alike) takes PyTorch's reference route, hundreds of times slower than float32; at 128x128 the
    # eight VAE decodes alone took over 25 minutes. This size takes about 11 minutes on 2 idle cores.
    out = tmp_path / "real.json"
    common = benchmark_module("common")
    r = common.run_process_tree([sys.executable, os.path.join(BENCHMARKS, "bench_real_size.py"), "--depth", REDUCED,
                                 "--parts", "eager,compiled,tp,cold", "--size", "32", "--rounds", "1", "--ranks", "2",
                                 "--json", str(out)], 2700, env=environment(TMPDIR=str(tmp_path)))
    assert r.returncode == 0 and out.exists(), r.stderr[-4000:]
    results = json.loads(out.read_text())["results"]
    assert not [p for p, v in results.items() if "error" in v], r.stderr[-4000:]
    for part in ("eager", "compiled"):
        assert results[part]["image_max_abs_diff"] < 2e-2, results[part]
        assert results[part]["neuron_allocated_bytes"] == results[part]["weights_bytes"]
    ranks = results["tp"]["ranks"]
    assert len({r["sharded_bytes"] for r in ranks}) == 1 and ranks[0]["sharded_bytes"] > 0
    assert results["tp"]["reference"]["relative_rms"] < 0.02
    cold = results["cold"]["samples"]
    assert [len(cold[b]) for b in ("neuron", "inductor")] == [1, 1]
    assert all(s["compile_s"] > 0 for b in cold for s in cold[b]), cold


def test_a_benchmark_child_that_runs_out_of_time_takes_its_own_children_with_it(tmp_path):
    # The benchmarks' parts start processes of their own (torchrun and its ranks); subprocess.run's
    # timeout would kill the direct child only and leave them running for as long as they like.
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired):
        benchmark_module("common").run_process_tree([sys.executable, "-c", script], 5)
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # killed: gone, or a zombie until init reaps it
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        pytest.fail("the grandchild outlived the timeout")
