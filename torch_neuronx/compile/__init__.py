"""The old home of the compile cache, kept so ``torch_neuronx.compile.cache`` still imports and
``python -m torch_neuronx.compile.cache`` still runs. The compiler is
:mod:`torch_neuronx.neuron_dynamo_backend`."""
