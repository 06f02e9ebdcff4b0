"""Old name of :mod:`torch_neuronx.neuron_dynamo_backend.cache`: importing it gives that module."""
import sys

from torch_neuronx.neuron_dynamo_backend import cache as _cache

if __name__ == "__main__":
    sys.exit(_cache.main())
sys.modules[__name__] = _cache
