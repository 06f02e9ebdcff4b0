"""The seed's eager program: FLUX.2-klein on one NeuronCore.

    python examples/eager_neuron.py [--model PATH_OR_HUB_ID] [--height H --width W --steps N]

Only the model source differs from the seed: by default a small Flux2-Klein pipeline built in
code (torch_neuronx.demo.pipelines); with --model, the real checkpoint in bf16.
"""
import torch
from diffusers import Flux2KleinPipeline

from torch_neuronx.demo.pipelines import argument_parser, model_source

args = argument_parser(__doc__).parse_args()
source, dtype = model_source(args.model)
torch.manual_seed(args.seed)

pipe = Flux2KleinPipeline.from_pretrained(source, dtype=dtype)
pipe.to("neuron")
image = pipe(prompt="a golden retriever surfing a wave, photorealistic",
             height=args.height, width=args.width, num_inference_steps=args.steps).images[0]
image.save(args.output)
