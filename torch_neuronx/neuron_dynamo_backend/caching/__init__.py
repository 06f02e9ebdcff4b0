"""What the compiler keeps across processes.

- :mod:`.neff_cache`: the compile cache, on disk as TorchNeuron's NEFF cache (``NeffCache``: sharded
  entries, checksums, locks, an in-memory tier); the ``neuron-cache`` command inspects it.
- :mod:`.graph_cache`: the Inductor executor's entries in it: each graph's key, and compile-or-load.
- :mod:`.precompile`: whole compiled functions (Dynamo's packages), with ``TORCH_CACHING_PRECOMPILE=1``.
- :mod:`.isa_probe`: Inductor's vector-ISA probes, remembered in the cache.
"""
