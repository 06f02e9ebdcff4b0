"""The main job (`make demo`, `neuronx-demo`): the seed's Flux2-Klein pipeline on the emulated
Trainium, eager then compiled, checked against plain PyTorch on CPU, with a short report.

    neuronx-demo [--model PATH_OR_HUB_ID] [--height H --width W --steps N] [--max-sequence-length N] [--tp N]
                 [--output PNG]

Phases, each seeded alike so their images are comparable:
  cpu eager (the oracle), neuron eager; the CPU transformer compiled by Inductor (the compiled
  oracle), then the neuron one with backend="neuron" (fullgraph, static shapes): warm-up (compiles),
  second call (reuses), a new height/width (compiles once more), another step count (compiles
  nothing); then the repeated blocks compiled instead (`compile_repeated_blocks`), by Inductor on
  CPU and by neuron. With --tp N it relaunches itself under torchrun, one process per emulated core,
  and runs the tensor-parallel program against one core's output.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from torch_neuronx.demo.pipelines import ModelNotFoundError, argument_parser, cpu_computing_as_neuron, model_source
from torch_neuronx.runtime import format_bytes

PROMPT = "a golden retriever surfing a wave, photorealistic"
TOLERANCE = 2e-3  # images in [0, 1]; float32 reordering across devices/compilers stays far below


@dataclasses.dataclass
class Phase:
    name: str
    size: str
    steps: int
    seconds: float
    graphs: int | None = None  # compiled during this phase
    cache: str = ""
    difference: str = ""


def generate(pipe, args, height: int | None = None, width: int | None = None, steps: int | None = None) -> np.ndarray:
    """The seed's call with the options' size, steps, seed and prompt length (or the size or steps given). On
    CPU, float64 is narrowed as diffusers narrows it on neuron, so that CPU is the oracle."""
    torch.manual_seed(args.seed)
    # A step-distilled Klein ignores guidance (and says so at every call, unless asked for none).
    guidance = {"guidance_scale": 1.0} if pipe.config.get("is_distilled") else {}
    narrowing = cpu_computing_as_neuron() if pipe.device.type == "cpu" else contextlib.nullcontext()
    with narrowing:
        return pipe(prompt=PROMPT, height=height or args.height, width=width or args.width,
                    num_inference_steps=steps or args.steps, output_type="np",
                    max_sequence_length=args.max_sequence_length, **guidance).images[0]


def compare(name: str, image: np.ndarray, reference: np.ndarray, label: str) -> str:
    difference = float(np.abs(image - reference).max())
    if difference > TOLERANCE:
        raise SystemExit(f"{name}: its image differs from the {label} one by {difference:.3g} (tolerance {TOLERANCE})")
    return f"{difference:.2g} vs {label}"


class Phases:
    """Runs and times phases; counts the graphs and cache results each adds to neuron's compile metrics."""

    def __init__(self, args):
        self.args, self.rows = args, []
        self.compiling = False  # once set, each neuron phase reports the graphs it compiled

    def run(self, name, pipe, against=None, height=None, width=None, steps=None) -> np.ndarray:
        """Run a phase; ``against`` = (image, label) to check its image with."""
        height, width = height or self.args.height, width or self.args.width
        steps = steps or self.args.steps
        before = len(torch.neuron.get_dynamo_metrics())
        start = time.perf_counter()
        image = generate(pipe, self.args, height, width, steps)
        seconds = time.perf_counter() - start
        new = torch.neuron.get_dynamo_metrics()[before:]
        graphs = len(new) if self.compiling and pipe.device.type == "neuron" else None
        self.rows.append(Phase(name, f"{width}x{height}", steps, seconds, graphs, ", ".join(m["cache"] for m in new),
                               compare(name, image, *against) if against else ""))
        return image


def table(rows: list[Phase]) -> str:
    lines = [f"{'phase':<34} {'size':>9} {'steps':>5} {'time s':>7} {'graphs':>6}  {'cache':<12} check"]
    for r in rows:
        graphs = "-" if r.graphs is None else str(r.graphs)
        lines.append(f"{r.name:<34} {r.size:>9} {r.steps:>5} {r.seconds:>7.2f} {graphs:>6}  {r.cache:<12} {r.difference}")
    return "\n".join(lines)


def describe_device() -> str:
    from torch_neuronx.runtime import topology

    index = torch.neuron.current_device()  # under torchrun the rank's core, neuron:<LOCAL_RANK>
    props = torch.neuron.get_device_properties(index)
    count = torch.neuron.device_count()
    return (f"device neuron:{index} ({props.chip} {props.core_arch}, NeuronCore {props.core_id}), "
            f"{topology.current().describe()}: "
            f"{count} visible core{'s' if count != 1 else ''}, {format_bytes(props.total_memory)} each; "
            "ops run on this host's CPU")


def describe_host_memory() -> str:
    """What the pipeline on neuron holds: the device's count, and on the host the process's own memory and
    the checkpoint's file pages it maps (the page cache the CPU reference read too: no second copy)."""
    from torch_neuronx.runtime import host_memory

    own, shared = host_memory.resident_bytes()
    return (f"pipeline on neuron:0: {format_bytes(torch.neuron.memory_allocated(0))} of device memory; this host: "
            f"{format_bytes(own)} of this process's own, {format_bytes(shared)} of checkpoint file pages it maps")


def describe_executor() -> str:
    """The executor of the compiled phases, chosen as the backend chooses it (no options here)."""
    from torch_neuronx.neuron_dynamo_backend import config

    try:
        chosen = config.executor({})
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    if chosen == "xla":
        return (f"compiled executor: xla (TorchNeuron's StableHLO program on XLA:CPU, float64 as float32; "
                f"{config.EXECUTOR_ENV}=xla)")
    return f"compiled executor: inductor (Inductor's CPU code; {config.EXECUTOR_ENV}=xla runs TorchNeuron's program)"


def single_core(args, source: str, dtype: torch.dtype) -> None:
    from diffusers import Flux2KleinPipeline

    print(f"model: {args.model or 'a small Flux2-Klein built in code'} ({source}), {str(dtype).replace('torch.', '')}")
    print(describe_device())
    print(describe_executor())
    cpu = Flux2KleinPipeline.from_pretrained(source, dtype=dtype)  # a checkpoint's pages, which neuron maps too
    phases = Phases(args)
    reference = phases.run("cpu eager (the oracle)", cpu)

    pipe = Flux2KleinPipeline.from_pretrained(source, dtype=dtype)
    pipe.to("neuron")
    print(describe_host_memory())
    image = phases.run("neuron eager", pipe, against=(reference, "cpu"))
    pipe.numpy_to_pil(image[None])[0].save(args.output)

    _compiled_phases(phases, pipe, cpu, source, dtype)
    del cpu
    _summary(phases, args)
    readiness(pipe, args, source, dtype)


def _compiled_phases(phases: Phases, pipe, cpu, source: str, dtype: torch.dtype) -> None:
    """The transformer compiled whole (warm-up, reuse, a new size, another step count), then block by block.
    The oracle of each is the same transformer compiled alike by Inductor on CPU: a compiler may fuse and
    round differently from eager (in bf16, visibly)."""
    args = phases.args
    torch.neuron.reset_dynamo_metrics()
    phases.compiling = True
    options = dict(fullgraph=True, dynamic=False)
    cpu.transformer.compile(backend="inductor", **options)
    inductor = (phases.run("cpu compiled (Inductor)", cpu), "inductor")
    pipe.transformer.compile(backend="neuron", **options)
    phases.run("neuron compiled, warm-up", pipe, against=inductor)
    phases.run("neuron compiled, second call", pipe, against=inductor)
    phases.run("neuron compiled, new size", pipe, height=args.height // 2, width=args.width // 2)
    phases.run("neuron compiled, other step count", pipe, steps=max(1, args.steps // 2))

    reload_transformer(pipe, source, dtype)  # compiled block by block this time
    reload_transformer(cpu, source, dtype)
    cpu.transformer.compile_repeated_blocks(backend="inductor", **options)
    inductor = (phases.run("cpu repeated blocks (Inductor)", cpu), "inductor")
    pipe.transformer.compile_repeated_blocks(backend="neuron", **options)
    phases.run("repeated blocks compiled, warm-up", pipe, against=inductor)
    phases.run("repeated blocks compiled, call", pipe, against=inductor)


def _summary(phases: Phases, args) -> None:
    """The phase table, the compiles, the memory peak; the phases as JSON when asked."""
    print()
    print(table(phases.rows))
    metrics = torch.neuron.get_dynamo_metrics()
    print(f"graphs compiled: {len(metrics)}; cache hits: {sum(m['cache'] == 'hit' for m in metrics)}; "
          f"compile time {sum(m['compile_us'] for m in metrics) / 1e6:.1f} s")
    print(f"memory peak on neuron:0: {format_bytes(torch.neuron.max_memory_allocated(0))} of "
          f"{format_bytes(torch.neuron.get_device_properties(0).total_memory)}")
    print(f"saved {args.output} (neuron eager)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in phases.rows], f, indent=1)


def reload_transformer(pipe, source: str, dtype: torch.dtype) -> None:
    """The pipeline's transformer loaded anew on its device, the old one and Dynamo's code for it dropped
    first: one core holds one transformer (at real size two do not fit its HBM)."""
    from diffusers import Flux2Transformer2DModel

    device = pipe.transformer.device
    pipe.transformer = None
    torch._dynamo.reset()
    gc.collect()
    transformer = Flux2Transformer2DModel.from_pretrained(source, subfolder="transformer", dtype=dtype).to(device)
    pipe.register_modules(transformer=transformer)  # its entry in the pipeline's config, as from_pretrained made it


def readiness(pipe, args, source: str, dtype: torch.dtype) -> None:
    """What a real Trainium would do differently: one eager and one compiled generation with
    diagnostics on (they add work to every eager op, so the timed phases above ran without)."""
    from torch_neuronx import diagnostics

    # The whole transformer compiled again (a cache hit), so its graph is costed.
    reload_transformer(pipe, source, dtype)
    diagnostics.start()
    with diagnostics.phase("eager generation"):
        generate(pipe, args)
    pipe.transformer.compile(backend="neuron", fullgraph=True, dynamic=False)
    with diagnostics.phase("compiled generation"):
        generate(pipe, args)
    diagnostics.stop()
    report = diagnostics.report()
    paths = diagnostics.write(report, args.report_dir)
    print()
    print(report)
    print(f"\nreport written to {paths['txt']}, {paths['json']} and {paths['html']}")


def tensor_parallel(args, source: str, dtype: torch.dtype) -> None:
    """One torchrun rank: the seed's tensor-parallel program, checked against one core."""
    import torch.distributed as dist
    from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel, TensorParallelConfig
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group(backend="neuron")
    mesh = DeviceMesh("neuron", list(range(dist.get_world_size())))
    device = torch.neuron.current_device()
    rank = dist.get_rank()
    transformer = Flux2Transformer2DModel.from_pretrained(source, subfolder="transformer", dtype=dtype,
                                                          parallel_config=TensorParallelConfig(mesh=mesh))
    pipe = Flux2KleinPipeline.from_pretrained(source, transformer=transformer, dtype=dtype)
    pipe.to(device)
    generate(pipe, args, steps=1)  # warm-up
    start = time.perf_counter()
    image = generate(pipe, args)
    seconds = time.perf_counter() - start
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, torch.neuron.max_memory_allocated())  # this rank's core, neuron:<LOCAL_RANK>
    if rank == 0:
        one_core = Flux2KleinPipeline.from_pretrained(source, dtype=dtype).to(device)
        start = time.perf_counter()
        reference = generate(one_core, args)
        single = time.perf_counter() - start
        check = compare("tensor parallel", image, reference, "one core")
        print(f"\n{describe_device()}")
        print(f"tensor parallel over {len(peaks)} cores: {seconds:.2f} s for {args.steps} steps at "
              f"{args.width}x{args.height} (one core: {single:.2f} s); image {check}")
        print("memory peak per core: " + ", ".join(f"rank {r} {format_bytes(p)}" for r, p in enumerate(peaks)))
        pipe.numpy_to_pil(image[None])[0].save(args.output)
        print(f"saved {args.output} (rank 0)")
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argument_parser(__doc__)
    parser.set_defaults(height=512, width=512)
    parser.add_argument("--tp", type=int, default=0, metavar="N", help="tensor parallel over N emulated cores")
    parser.add_argument("--max-sequence-length", type=int, default=512, metavar="N",
                        help="the prompt's length in tokens, padded (the pipeline's max_sequence_length; default "
                             "%(default)s, the seed's); the text encoder's and the transformer's work grow with it")
    parser.add_argument("--json", metavar="PATH", help="also write the phases (single core) as JSON")
    parser.add_argument("--report-dir", default="neuron_report", metavar="DIR",
                        help="where to write the Trainium readiness report (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        source, dtype = model_source(args.model)
    except ModelNotFoundError as error:
        raise SystemExit(f"error: {error}") from None
    if args.tp and "LOCAL_RANK" not in os.environ:  # relaunch: one process per core
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.tp}",
                   "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "-m", "torch_neuronx.demo",
                   *(argv if argv is not None else sys.argv[1:])]
        raise SystemExit(subprocess.call(command))
    if args.tp:
        tensor_parallel(args, source, dtype)
    else:
        single_core(args, source, dtype)
    return 0
