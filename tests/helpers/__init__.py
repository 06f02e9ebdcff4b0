"""Helpers the test files share (fixtures live in tests/conftest.py):

- ``isolated``: run code in a fresh interpreter (``run``), with an environment free of the
  variables this process inherited from earlier tests (``environment``, ``TOPOLOGY_VARIABLES``);
  for behaviour decided at ``import torch``.
- ``oracle``: CPU is the oracle; ``to_device`` moves nested inputs, ``assert_same`` compares a
  neuron result with the CPU one (device, dtype, shape, values; exact unless given tolerances).
- ``sweeps``: what the OpInfo and ModuleInfo sweeps share: one seed for CPU and every neuron
  generator (``seed``, ``SEED``) and single-threaded runs (``one_thread``).
"""
