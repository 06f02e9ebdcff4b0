"""The seed's Flux2 transformer (diffusers' Flux2Transformer2DModel, reduced) on one device: a denoising
step eager, then the same step compiled with backend="neuron", each marked as a step. Run under
`python -m torch_neuronx.run` (the readiness report) and `python -m torch_neuronx.simulate` (the plan on
one rank), both must estimate the same time: they share one model."""
import torch
from diffusers import Flux2Transformer2DModel

from torch_neuronx.simulate import step

config = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
              num_attention_heads=4, joint_attention_dim=32, timestep_guidance_channels=32,
              axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)
torch.manual_seed(0)
model = Flux2Transformer2DModel(**config).to(torch.bfloat16).eval().to("neuron")
image_tokens, text_tokens = 64, 16
hidden = torch.randn(1, image_tokens, 16, dtype=torch.bfloat16).to("neuron")
text = torch.randn(1, text_tokens, 32, dtype=torch.bfloat16).to("neuron")
inputs = dict(hidden_states=hidden, encoder_hidden_states=text, timestep=torch.tensor([0.5]).to("neuron"),
              img_ids=torch.zeros(image_tokens, 4, dtype=torch.long).to("neuron"),
              txt_ids=torch.zeros(text_tokens, 4, dtype=torch.long).to("neuron"))
with torch.no_grad():
    with step("eager"):
        model(**inputs)
    model.compile(backend="neuron", fullgraph=True, dynamic=False)
    model(**inputs)  # compiles
    with step("compiled"):
        model(**inputs)
