"""``neuron-cache`` and ``python -m torch_neuronx.neuron_cache``: the compile cache's command line
(:mod:`torch_neuronx.neuron_dynamo_backend.caching.cli`), under the name users type."""
import sys

from torch_neuronx.neuron_dynamo_backend.caching.cli import main

if __name__ == "__main__":
    sys.exit(main())
