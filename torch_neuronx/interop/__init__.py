"""Where PyTorch and other libraries meet the neuron device: adaptations installed at registration,
each by its module's ``install()`` (``_registration.register()`` calls them in order).

- :mod:`.threads`: backward on the caller's thread; ``torch.set_num_threads`` reaches neuron's threads.
- :mod:`.dlpack`: neuron tensors exported as host memory, without a copy.
- :mod:`.distribution_alias`: libraries that look TorchNeuron up by its distribution name find ours.
- :mod:`.ecosystem_errors`: clear errors where a library fails on neuron as on Trainium (Inductor,
  safetensors).
- :mod:`.dynamo_rules`: Dynamo never traces torch_neuronx; ``torch.neuron``'s queries fold as
  ``torch.cuda``'s.

They sit above :mod:`torch_neuronx.neuron` (the device) and import nothing higher.
"""
