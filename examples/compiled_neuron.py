"""The seed's compiled program: the transformer compiled with backend="neuron", static shapes.

    python examples/compiled_neuron.py [--model PATH_OR_HUB_ID] [--height H --width W --steps N]

The warm-up call compiles; the second call, with the same shapes, reuses the compiled graph.
Only the model source differs from the seed (see eager_neuron.py).
"""
import time

import torch
from diffusers import Flux2KleinPipeline

from torch_neuronx.demo.pipelines import argument_parser, model_source

args = argument_parser(__doc__).parse_args()
source, dtype = model_source(args.model)
torch.manual_seed(args.seed)

pipe = Flux2KleinPipeline.from_pretrained(source, dtype=dtype)
pipe.to("neuron")
pipe.transformer.compile(backend="neuron", fullgraph=True, dynamic=False)
start = time.perf_counter()
pipe(prompt="warmup", height=args.height, width=args.width, num_inference_steps=args.steps)   # compiles
warmup = time.perf_counter() - start
torch.manual_seed(args.seed)  # the same latents as the eager program draws
start = time.perf_counter()
image = pipe(prompt="a golden retriever surfing a wave, photorealistic",
             height=args.height, width=args.width, num_inference_steps=args.steps).images[0]  # reuses
print(f"warm-up (compiles) {warmup:.2f} s, second call (reuses) {time.perf_counter() - start:.2f} s, "
      f"graphs compiled: {len(torch.neuron.get_dynamo_metrics())}")
image.save(args.output)
