"""What the op and module sweeps share: one seed for every generator, and one thread."""
import contextlib

import torch

SEED = 1234
_generators = []


def seed(value: int = SEED) -> None:
    """Same seed for CPU and every neuron generator. (torch.manual_seed does both, but records a
    Python stack for each lazy CUDA/XPU/MTIA seeding call, a cost a sweep would pay on every sample.)
    The generators are looked up on first use: touching them at import would initialize neuron
    during collection, under the feet of tests that check lazy initialization."""
    if not _generators:
        _generators.extend([torch.default_generator, *torch.neuron.default_generators])
    for g in _generators:
        g.manual_seed(value)


@contextlib.contextmanager
def one_thread():
    """Run single-threaded. Sweep samples are tiny (far below ATen's parallel grain), so threads
    only add OpenMP synchronisation, which costs dearly on a 2-core machine shared with compile
    jobs. Both sides (CPU and neuron) run with the same setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
