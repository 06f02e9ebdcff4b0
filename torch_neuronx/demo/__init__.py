"""The main job (`make demo`, `neuronx-demo`, `python -m torch_neuronx.demo`): the seed's
Flux2-Klein pipeline on neuron, and the small pipelines it and the examples use (`pipelines`)."""
