"""The seed's tensor-parallel program: the transformer sharded across NeuronCores, one process each.

    torchrun --nproc_per_node=N examples/tensor_parallel_neuron.py [--model PATH_OR_HUB_ID] [...]

Each rank loads its shard of the transformer straight from the checkpoint (parallel_config) and
the other components whole, on its own core; rank 0 saves the image. Only the model source
differs from the seed (see eager_neuron.py).
"""
import torch
import torch.distributed as dist
from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel, TensorParallelConfig
from torch.distributed.device_mesh import DeviceMesh

from torch_neuronx.demo.pipelines import argument_parser, model_source
from torch_neuronx.runtime import host_memory
from torch_neuronx.runtime.units import format_bytes


def say_memory(when: str, on_core: str) -> None:
    own, shared = host_memory.resident_bytes()  # a checkpoint's pages are shared by the ranks that map them
    print(f"rank {dist.get_rank()}{when}: host memory {format_bytes(own)} of its own, {format_bytes(shared)} of "
          f"shared file pages; {on_core} on neuron:{device}", flush=True)


args = argument_parser(__doc__).parse_args()

dist.init_process_group(backend="neuron")
mesh = DeviceMesh("neuron", list(range(dist.get_world_size())))
device = torch.neuron.current_device()
parallel_config = TensorParallelConfig(mesh=mesh)

source, dtype = model_source(args.model, sharded=("transformer",))  # checks this host can hold every rank
torch.manual_seed(args.seed)  # every rank draws the same latents
transformer = Flux2Transformer2DModel.from_pretrained(source, subfolder="transformer", dtype=dtype,
                                                      parallel_config=parallel_config)
pipe = Flux2KleinPipeline.from_pretrained(source, transformer=transformer, dtype=dtype)
pipe.to(device)

say_memory(", loaded", f"{format_bytes(torch.neuron.memory_allocated())} allocated")
image = pipe(prompt="a golden retriever surfing a wave, photorealistic",
             height=args.height, width=args.width, num_inference_steps=args.steps).images[0]
if dist.get_rank() == 0:
    image.save(args.output)
say_memory("", f"{format_bytes(torch.neuron.max_memory_allocated())} peak")
dist.destroy_process_group()
