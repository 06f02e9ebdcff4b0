"""FLUX.2-klein-4B at its real size (random weights, bf16: torch_neuronx.demo.real_size) on this host,
against plain PyTorch on the same machine: eager, compiled and tensor parallel.

Each part runs in a fresh child process of its own, so its memory peaks are its own:
- eager: ``from_pretrained`` then ``.to("neuron")``, each with its time and memory peaks, then the
  seed's call on neuron and on CPU, interleaved round by round. The CPU pipeline is a twin over the
  neuron pipeline's bytes (CPU aliases, no copy), so both run on the very same weights and the host
  holds them once. Per phase (prompt encoding, each denoising step, the VAE decode): the median of
  the per-round ratios neuron / CPU.
- compiled: the same, with the neuron transformer compiled by ``backend="neuron"`` and the twin's by
  Inductor (both fullgraph, static shapes; empty caches): each one's compile (first call), then the
  per-round ratios.
- tp: torchrun with N ranks on this host, each loading its shard of the real transformer straight
  from the checkpoint (``parallel_config``) and running one transformer step; per rank its peak
  memory against its shard plus the replicated parts, then one CPU process runs the same step on
  the whole transformer, the oracle of rank 0's output.
- tp-program: the seed's tensor-parallel program itself (examples/tensor_parallel_neuron.py, unchanged) under
  torchrun with N ranks, ``--model real-size-random``: the ranks' anonymous memory sampled from outside (each
  rank's peak, and the peak of their sum at one instant) against the transformer's bytes plus the
  activations (each rank's core: its peak less what it held once loaded) plus 1 GB, and rank 0's image
  against the same call on CPU in one process.
- large: the seed's call at 1024x1024 with 4 steps, once on neuron and once on CPU (measured).
- load: ``from_pretrained`` to the first image, each in a process of its own, on neuron (the
  checkpoint's pages mapped by ``.to("neuron")``), on neuron copying them
  (``TORCH_NEURONX_MAP_CHECKPOINTS=0``, as before) and on CPU, with the checkpoint's pages evicted from
  the page cache first (cold: ``posix_fadvise(DONTNEED)``) or read into it (warm), alternating round by
  round: the load, the move and the first call's seconds, and the process's own memory.
- cold: the transformer alone compiled by ``backend="neuron"`` and by Inductor, each in a process of
  its own with empty caches (in one process the second compile would reuse the first one's kernels),
  alternating round by round: the compile (the first step less a later one) and the memory the
  compile and the calls add to the loaded weights.

Memory: the anonymous peak (what the process owns) and the resident peak (VmHWM), which also
counts pages of the checkpoint files the loaders map, the kernel's reclaimable page cache.

    python benchmarks/bench_real_size.py [--json PATH] [--parts eager,compiled,tp,large,cold,load] [--size 256]
        [--steps 1] [--rounds 3] [--ranks 4] [--load-variants neuron,cpu,neuron-copy]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import common  # beside this script (sys.path[0])

common.apply_malloc_env()

import targets  # noqa: E402

PARTS = ("eager", "compiled", "tp", "large", "cold", "load", "tp-program")
LOAD_VARIANTS = ("neuron", "cpu", "neuron-copy")
COLD_BACKENDS = ("neuron", "inductor")
CHILD_MARK = "BENCH_REAL_SIZE_RESULT "
CHILD_TIMEOUT_S = 3600


def _child_env(cache_dir):
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=os.path.join(cache_dir, "neff"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"))
    return env


def spawn(part, opts, cache_dir, extra=()):
    cmd = [sys.executable, os.path.abspath(__file__), "--_part", part, "--size", str(opts.size), "--steps",
           str(opts.steps), "--rounds", str(opts.rounds), "--ranks", str(opts.ranks), "--depth", opts.depth, *extra]
    return common.run_child_process(cmd, _child_env(cache_dir), CHILD_MARK, CHILD_TIMEOUT_S, label=part)


def depth(opts):
    from torch_neuronx.demo.real_size import Depth

    return Depth(*map(int, opts.depth.split(",")))


def emit(result):
    print(CHILD_MARK + json.dumps(result), flush=True)


# ---------------------------------------------------------------- eager and compiled (children)

def _prepare(opts, compiled):
    import torch

    import real_size_parts as parts
    from torch_neuronx.demo.real_size import real_size_random_path

    peaks = parts.MemoryPeaks()
    path = real_size_random_path(depth=depth(opts))
    neuron, record = parts.load_pipeline(path, peaks)
    cpu = parts.host_twin_pipeline(neuron)
    parts.narrow_cpu_like_neuron()
    pipes = {"cpu": cpu, "neuron": neuron}
    if compiled:
        torch._dynamo.config.cache_size_limit = 8
        neuron.transformer.compile(backend="neuron", fullgraph=True, dynamic=False)
        cpu.transformer.compile(backend="inductor", fullgraph=True, dynamic=False)
    return pipes, {v: parts.PhaseTimes(p) for v, p in pipes.items()}, peaks, record


def _first_calls(pipes, timers, peaks, opts):
    import real_size_parts as parts

    first, images = {}, {}
    for variant in ("neuron", "cpu"):  # neuron first: its compile starts from empty caches
        peaks.reset()
        start = time.perf_counter()
        images[variant] = parts.generate(pipes[variant], opts.size, opts.steps)
        first[variant] = {"s": time.perf_counter() - start, "phases": timers[variant].take(), **peaks.peaks()}
    return first, images


def _rounds(pipes, timers, peaks, opts):
    import real_size_parts as parts

    samples = {v: [] for v in pipes}
    peaks.reset()
    for r in range(opts.rounds):
        for variant in common.round_order(list(pipes), r):
            start = time.perf_counter()
            parts.generate(pipes[variant], opts.size, opts.steps)
            samples[variant].append({"s": time.perf_counter() - start, **timers[variant].take()})
    return samples, peaks.peaks()


def _phase_ratios(samples):
    """Per phase, the neuron / CPU ratio of each round (a step: the round's median step)."""
    def phase_s(sample, phase):
        return statistics.median(sample[phase]) if phase == "step" else sum(sample[phase])
    return {phase: [phase_s(n, phase) / phase_s(c, phase) for n, c in zip(samples["neuron"], samples["cpu"])]
            for phase in ("text", "step", "vae")} | {
        "call": [n["s"] / c["s"] for n, c in zip(samples["neuron"], samples["cpu"])]}


def run_pipeline_part(opts, compiled):
    import numpy as np
    import torch

    torch.set_grad_enabled(False)
    pipes, timers, peaks, record = _prepare(opts, compiled)
    first, images = _first_calls(pipes, timers, peaks, opts)
    samples, round_peaks = _rounds(pipes, timers, peaks, opts)
    difference = np.abs(images["neuron"].astype(np.float64) - images["cpu"].astype(np.float64))
    emit({**record, "size": opts.size, "steps": opts.steps, "first_calls": first, "samples": samples,
          "round_peaks": round_peaks, "ratios": _phase_ratios(samples),
          "image_max_abs_diff": float(difference.max()), "image_mean_abs_diff": float(difference.mean()),
          "image_std": float(images["cpu"].std())})


# ---------------------------------------------------------------- cold compiles (children)

def run_cold_compile(opts, backend):
    import torch
    from diffusers import Flux2Transformer2DModel

    import real_size_parts as parts
    from torch_neuronx.demo.real_size import real_size_random_path

    torch.set_grad_enabled(False)
    device = "neuron" if backend == "neuron" else "cpu"
    transformer = Flux2Transformer2DModel.from_pretrained(real_size_random_path(depth=depth(opts)),
                                                          subfolder="transformer", dtype=torch.bfloat16).to(device)
    transformer.compile(backend=backend, fullgraph=True, dynamic=False)
    inputs, peaks, calls_s = parts.step_inputs(opts.size, device), parts.MemoryPeaks(), []
    before = peaks.status()["RssAnon"]  # on CPU the weights stay mapped from the file, on neuron they are owned
    for _ in range(3):
        start = time.perf_counter()
        transformer(**inputs)
        calls_s.append(time.perf_counter() - start)
    emit({"backend": backend, "calls_s": calls_s, "compile_s": calls_s[0] - min(calls_s[1:]),
          "anon_added": peaks.peaks()["anon_peak"] - before})


def cold_part(opts, cache_dir):
    samples = {b: [] for b in COLD_BACKENDS}
    for r in range(opts.rounds):
        for backend in common.round_order(list(COLD_BACKENDS), r):
            result = spawn("cold-compile", opts, tempfile.mkdtemp(prefix="cold-", dir=cache_dir),
                           ["--_backend", backend])
            if "error" in result:
                return result
            samples[backend].append(result)
    return {"size": opts.size, "samples": samples}


# ---------------------------------------------------------------- tensor parallel (torchrun ranks)

def _shard_bytes(module):
    """(bytes this rank holds of sharded parameters, bytes of replicated ones)."""
    from torch.distributed.tensor import DTensor, Shard

    sharded = replicated = 0
    for t in [*module.parameters(), *module.buffers()]:
        if isinstance(t, DTensor) and any(isinstance(p, Shard) for p in t.placements):
            sharded += t.to_local().untyped_storage().nbytes()
        else:
            local = t.to_local() if isinstance(t, DTensor) else t
            replicated += local.untyped_storage().nbytes()
    return sharded, replicated


def run_tp_rank(opts, out_dir):
    import torch
    import torch.distributed as dist
    from diffusers import Flux2Transformer2DModel, TensorParallelConfig
    from torch.distributed.device_mesh import DeviceMesh

    import real_size_parts as parts
    from torch_neuronx.demo.real_size import real_size_random_path

    torch.set_grad_enabled(False)
    peaks = parts.MemoryPeaks()
    dist.init_process_group(backend="neuron")
    rank, mesh = dist.get_rank(), DeviceMesh("neuron", list(range(dist.get_world_size())))
    start = time.perf_counter()
    transformer = Flux2Transformer2DModel.from_pretrained(
        real_size_random_path(depth=depth(opts)), subfolder="transformer", dtype=torch.bfloat16,
        parallel_config=TensorParallelConfig(mesh=mesh))
    load = {"s": time.perf_counter() - start, **peaks.peaks()}
    inputs = parts.step_inputs(opts.size, torch.neuron.current_device())
    transformer(**inputs)
    start = time.perf_counter()
    output = transformer(**inputs)[0]
    step_s = time.perf_counter() - start
    sharded, replicated = _shard_bytes(transformer)
    if rank == 0:
        torch.save(output.cpu(), os.path.join(out_dir, "rank0.pt"))
    result = {"rank": rank, "load": load, "step_s": step_s, "sharded_bytes": sharded, "replicated_bytes": replicated,
              "neuron_allocated_bytes": torch.neuron.memory_allocated(), **peaks.peaks()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def run_tp_reference(opts, out_dir):
    """The whole transformer on CPU, one process: rank 0's output against it."""
    import torch
    from diffusers import Flux2Transformer2DModel

    import real_size_parts as parts
    from torch_neuronx.demo.real_size import real_size_random_path

    torch.set_grad_enabled(False)
    transformer = Flux2Transformer2DModel.from_pretrained(real_size_random_path(depth=depth(opts)), subfolder="transformer",
                                                          dtype=torch.bfloat16)
    expected = transformer(**parts.step_inputs(opts.size, "cpu"))[0].float()
    got = torch.load(os.path.join(out_dir, "rank0.pt")).float()
    emit({"max_abs_diff": float((got - expected).abs().max()), "expected_std": float(expected.std()),
          "relative_rms": float((got - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt())})


def tp_part(opts, cache_dir):
    import subprocess

    out_dir = tempfile.mkdtemp(prefix="tp-", dir=cache_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={opts.ranks}", "--rdzv-backend=c10d",
           "--rdzv-endpoint=localhost:0", os.path.abspath(__file__), "--_part", "tp-rank", "--size", str(opts.size),
           "--depth", opts.depth, "--_out", out_dir]
    start = time.perf_counter()
    try:
        proc = common.run_process_tree(cmd, CHILD_TIMEOUT_S, env=_child_env(cache_dir))
    except subprocess.TimeoutExpired as expired:
        return {"error": f"torchrun timed out after {CHILD_TIMEOUT_S} s", "stderr": (expired.stderr or "")[-4000:]}
    wall_s = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": f"torchrun exit code {proc.returncode}", "stderr": proc.stderr[-4000:]}
    ranks = [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(opts.ranks)]
    reference = spawn("tp-reference", opts, cache_dir, ["--_out", out_dir])
    return {"ranks": ranks, "wall_s": wall_s, "reference": reference,
            "sum_anon_peak": sum(r["anon_peak"] for r in ranks), "host_total": _host_total()}


def _host_total():
    from torch_neuronx.runtime import host_memory

    return host_memory.total_bytes()


# ---------------------------------------------------------------- the seed's TP program, unchanged (torchrun)

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "tensor_parallel_neuron.py")


class RankMemory:
    """Samples, from outside, the anonymous and file-backed memory of torchrun's ranks (the launcher's
    children running ``script``): each rank's peak, and the peak of their sum at one instant."""

    def __init__(self, launcher_pid, script, interval_s=0.1):
        import threading

        self.launcher_pid, self.script, self.interval_s = launcher_pid, script, interval_s
        self.rank_anon_peak, self.total_anon_peak, self.total_file_at_peak = {}, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _ranks(self):
        import psutil

        try:
            tree = psutil.Process(self.launcher_pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [p for p in tree if _is_rank(p, self.script)]

    def _sample(self):
        from torch_neuronx.runtime import host_memory

        while not self._stop.wait(self.interval_s):
            anon = file = 0
            for process in self._ranks():
                try:
                    own, shared = host_memory.resident_bytes(process.pid)
                except (OSError, KeyError):  # gone, or a zombie (no Rss lines)
                    continue
                anon, file = anon + own, file + shared
                self.rank_anon_peak[process.pid] = max(self.rank_anon_peak.get(process.pid, 0), own)
            if anon > self.total_anon_peak:
                self.total_anon_peak, self.total_file_at_peak = anon, file

    def stop(self):
        self._stop.set()
        self._thread.join()

    def rank_peaks(self):
        return sorted(self.rank_anon_peak.values(), reverse=True)


def _is_rank(process, script):
    import psutil

    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return False
    return script in cmdline and "torch.distributed.run" not in cmdline


def _run_ranks(cmd, script, env, cwd):
    """torchrun ``cmd`` under a RankMemory sampler: (seconds, stdout, RankMemory), or {"error": ...}."""
    import subprocess

    start = time.perf_counter()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env) as proc:
        memory = RankMemory(proc.pid, script)
        try:
            out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"error": f"torchrun timed out after {CHILD_TIMEOUT_S} s", "stderr": err[-4000:]}
        finally:
            memory.stop()
    if proc.returncode != 0:
        return {"error": f"torchrun exit code {proc.returncode}", "stderr": (out + err)[-4000:]}
    return time.perf_counter() - start, out, memory


def _torchrun(opts):
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={opts.ranks}", "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0"]


def tp_program_part(opts, cache_dir):
    """torchrun --nproc_per_node N examples/tensor_parallel_neuron.py --model real-size-random, then the same
    program on CPU ranks (gloo) and the same call on CPU in one process: the host's anonymous memory against
    the weights and against CPU's ranks, and rank 0's image against both."""
    from torch_neuronx.demo import pipelines, real_size

    if not depth(opts).is_real:
        raise SystemExit("--parts tp-program runs the seed's program as is: the real depth only (--depth 5,20,36)")
    path = real_size.real_size_random_path()
    out_dir = tempfile.mkdtemp(prefix="tp-program-", dir=cache_dir)
    image_path, cpu_image_path = os.path.join(out_dir, "tp.png"), os.path.join(out_dir, "tp-cpu.png")
    size = ["--height", str(opts.size), "--width", str(opts.size), "--steps", str(opts.steps)]
    # the user's own allocator settings, not the benchmark's (which keep freed memory to time both sides alike)
    env = {k: v for k, v in _child_env(cache_dir).items() if k not in common.MALLOC_ENV}
    run = _run_ranks([*_torchrun(opts), EXAMPLE, "--model", real_size.NAME, *size, "--output", image_path],
                     EXAMPLE, env, out_dir)
    if isinstance(run, dict):
        return run
    wall_s, out, memory = run
    from real_size_report import tp_program_ranks

    script = os.path.abspath(__file__)
    cpu_run = _run_ranks([*_torchrun(opts), script, "--_part", "tp-program-cpu-rank", "--size", str(opts.size),
                          "--steps", str(opts.steps), "--_out", cpu_image_path], script, env, out_dir)
    if isinstance(cpu_run, dict):
        cpu_ranks, images = cpu_run, image_path
    else:
        cpu_wall_s, _, cpu_memory = cpu_run
        cpu_ranks = {"wall_s": cpu_wall_s, "rank_anon_peaks": cpu_memory.rank_peaks(),
                     "total_anon_peak": cpu_memory.total_anon_peak}
        images = image_path + os.pathsep + cpu_image_path
    reference = spawn("tp-program-reference", opts, cache_dir, ["--_out", images])
    return {"wall_s": wall_s, "ranks": tp_program_ranks(out), "rank_anon_peaks": memory.rank_peaks(),
            "total_anon_peak": memory.total_anon_peak, "total_file_at_peak": memory.total_file_at_peak,
            "component_bytes": pipelines._component_bytes(path), "cpu_ranks": cpu_ranks, "reference": reference,
            "host_total": _host_total(), "stdout": out[-3000:]}


def run_tp_program_cpu_rank(opts, image_path):
    """One CPU rank of the example's program: the same streaming loader, shards and call, with gloo and
    DeviceMesh("cpu"), diffusers' float64 narrowed as on neuron. Rank 0 saves the image.

    diffusers allows tensor parallelism on accelerators only, and places the shards on the accelerator
    (neuron here): the twin lifts that check and places them on CPU, and changes nothing else."""
    import diffusers.hooks.tensor_parallel as diffusers_tp
    import torch
    import torch.distributed as dist
    from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel, TensorParallelConfig
    from torch.distributed.device_mesh import DeviceMesh

    import real_size_parts as parts
    from torch_neuronx.demo.cli import PROMPT
    from torch_neuronx.demo.real_size import real_size_random_path

    class CpuTensorParallelConfig(TensorParallelConfig):
        def setup(self, rank, world_size, device, mesh):
            super().setup(rank, world_size, torch.device("cpu"), mesh)

    diffusers_tp._SUPPORTED_TP_DEVICES = (*diffusers_tp._SUPPORTED_TP_DEVICES, "cpu")
    parts.narrow_cpu_like_neuron()
    dist.init_process_group(backend="gloo")
    mesh = DeviceMesh("cpu", list(range(dist.get_world_size())))
    source = real_size_random_path()
    torch.manual_seed(0)  # where the example seeds
    transformer = Flux2Transformer2DModel.from_pretrained(source, subfolder="transformer", dtype=torch.bfloat16,
                                                          parallel_config=CpuTensorParallelConfig(mesh=mesh))
    pipe = Flux2KleinPipeline.from_pretrained(source, transformer=transformer, dtype=torch.bfloat16)
    image = pipe(prompt=PROMPT, height=opts.size, width=opts.size, num_inference_steps=opts.steps).images[0]
    if dist.get_rank() == 0:
        image.save(image_path)
    dist.destroy_process_group()


def _image_difference(got, expected):
    import numpy as np

    difference = np.abs(got - expected)
    return {"max_abs_diff": int(difference.max()), "mean_abs_diff": float(difference.mean()),
            "p999_abs_diff": float(np.percentile(difference, 99.9)), "share_over_2": float((difference > 2).mean()),
            "relative_rms": float(np.sqrt((difference.astype(np.float64) ** 2).mean()) / expected.std())}


def run_tp_program_reference(opts, image_paths):
    """The example's call on CPU in one process (diffusers' float64 narrowed as on neuron): rank 0's image
    against it, and against the CPU ranks' image when there is one (``image_paths``: the neuron ranks'
    image, then the CPU ranks', joined by os.pathsep)."""
    import numpy as np
    import torch
    from diffusers import Flux2KleinPipeline
    from PIL import Image

    import real_size_parts as parts
    from torch_neuronx.demo.cli import PROMPT  # the example's
    from torch_neuronx.demo.real_size import real_size_random_path

    torch.set_grad_enabled(False)
    parts.narrow_cpu_like_neuron()
    peaks = parts.MemoryPeaks()
    torch.manual_seed(0)  # the example's --seed default, where the example sets it
    pipe = Flux2KleinPipeline.from_pretrained(real_size_random_path(), dtype=torch.bfloat16)
    start = time.perf_counter()
    expected = np.asarray(pipe(prompt=PROMPT, height=opts.size, width=opts.size,
                               num_inference_steps=opts.steps).images[0], dtype=np.int16)
    call_s = time.perf_counter() - start
    images = [np.asarray(Image.open(p), dtype=np.int16) for p in image_paths.split(os.pathsep)]
    result = {"call_s": call_s, **peaks.peaks(), **_image_difference(images[0], expected),
              "expected_std": float(expected.std())}
    if len(images) == 2:
        result["vs_cpu_ranks"] = _image_difference(images[0], images[1])
        result["cpu_ranks_vs_one_process"] = _image_difference(images[1], expected)
    emit(result)


# ---------------------------------------------------------------- from_pretrained to first image (children)

def _checkpoint_files(path):
    return [os.path.join(root, f) for root, _, files in os.walk(path) for f in files if f.endswith(".safetensors")]


def _page_cache(path, cold):
    """Evict the checkpoint's pages from the page cache (cold) or read them all into it (warm)."""
    for name in _checkpoint_files(path):
        with open(name, "rb") as f:
            if cold:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while f.read(1 << 24):
                    pass


def run_load(opts, variant, cache):
    import torch
    from diffusers import Flux2KleinPipeline

    import real_size_parts as parts
    from torch_neuronx.demo.real_size import real_size_random_path

    torch.set_grad_enabled(False)
    path = real_size_random_path(depth=depth(opts))
    if variant == "neuron-copy":
        torch.ops.neuron._set_map_checkpoints(False)
    _page_cache(path, cache == "cold")
    peaks = parts.MemoryPeaks()
    times, start = {}, time.perf_counter()
    pipe = Flux2KleinPipeline.from_pretrained(path, dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    times["from_pretrained_s"] = time.perf_counter() - start
    pipe.to("cpu" if variant == "cpu" else "neuron")
    times["to_s"] = time.perf_counter() - start - times["from_pretrained_s"]
    image = parts.generate(pipe, opts.size, opts.steps)
    times["total_s"] = time.perf_counter() - start
    emit({**times, **peaks.peaks(), "image_sum": float(image.astype("float64").sum()),
          "mapped_blocks": int(torch.ops.neuron._checkpoint_blocks())})


def load_part(opts, cache_dir):
    variants = opts.load_variants.split(",")
    unknown = sorted(set(variants) - set(LOAD_VARIANTS))
    if unknown or not {"neuron", "cpu"} <= set(variants):
        raise SystemExit(f"--load-variants {opts.load_variants}: needs neuron and cpu, from {', '.join(LOAD_VARIANTS)}")
    samples = {cache: {v: [] for v in variants} for cache in ("cold", "warm")}
    for r in range(opts.rounds):
        for cache in ("cold", "warm"):
            for variant in common.round_order(variants, r):
                result = spawn("load-one", opts, cache_dir, ["--_backend", f"{variant}:{cache}"])
                if "error" in result:
                    return result
                samples[cache][variant].append(result)
    return {"samples": samples, "size": opts.size, "steps": opts.steps, "depth": opts.depth}


# ---------------------------------------------------------------- parent: run, report

def parse(argv=None):
    parser = common.arguments(__doc__, threads=False)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--load-variants", default=",".join(LOAD_VARIANTS),
                        help="the load part's runs (neuron-copy: the move copying, as before; it doubles the "
                             "memory and adds runs)")
    parser.add_argument("--depth", default="5,20,36", help="double blocks, single blocks, text layers "
                                                                "(default: the checkpoint's)")
    parser.add_argument("--_part", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    parser.add_argument("--_backend", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_parts(opts):
    from real_size_report import large_options

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-real-size-") as cache_dir:
        for part in opts.parts.split(","):
            start = time.perf_counter()
            if part == "tp":
                results[part] = tp_part(opts, cache_dir)
            elif part == "tp-program":
                results[part] = tp_program_part(opts, cache_dir)
            elif part == "cold":
                results[part] = cold_part(opts, cache_dir)
            elif part == "load":
                results[part] = load_part(opts, cache_dir)
            elif part == "large":
                results[part] = spawn("eager", large_options(opts), cache_dir)
            else:
                results[part] = spawn(part, opts, cache_dir)
            print(f"  {part}: {time.perf_counter() - start:.0f} s"
                  + (f" FAILED {results[part]['error']}\n{results[part].get('stderr', '')}"
                     if "error" in results[part] else ""), file=sys.stderr, flush=True)
    return results


def main():
    opts = parse()
    if opts._part in ("eager", "compiled"):
        return run_pipeline_part(opts, compiled=opts._part == "compiled")
    if opts._part == "tp-rank":
        return run_tp_rank(opts, opts._out)
    if opts._part == "tp-reference":
        return run_tp_reference(opts, opts._out)
    if opts._part == "tp-program-cpu-rank":
        return run_tp_program_cpu_rank(opts, opts._out)
    if opts._part == "tp-program-reference":
        return run_tp_program_reference(opts, opts._out)
    if opts._part == "cold-compile":
        return run_cold_compile(opts, opts._backend)
    if opts._part == "load-one":
        return run_load(opts, *opts._backend.split(":"))
    import real_size_report as report

    load, start = common.load_average(), time.perf_counter()
    results = run_parts(opts)
    entries = report.target_entries(results, targets.target)
    text = report.markdown(results, opts, common.conditions(load, common.load_average(),
                                                            time.perf_counter() - start))
    print(text + "\n\n" + targets.table(entries))
    if opts.json:
        common.write_json(opts.json, {"results": results, "targets": entries, "markdown": text})
    common.report_outcome([e["name"] for e in entries if not e["pass"]],
                          [p for p, r in results.items() if "error" in r])


if __name__ == "__main__":
    main()
