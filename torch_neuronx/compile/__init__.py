"""torch.compile(backend="neuron"): host code generation and the NEFF-style compile cache."""
import os as _os

# Whether the user chose Inductor's cache directory. Read when torch_neuronx loads, before
# anything compiles: Dynamo and Inductor fill in their default while they work.
USER_INDUCTOR_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR" in _os.environ
