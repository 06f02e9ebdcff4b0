"""Random number generation on neuron: one default generator per device,
independent of the CPU generator (``torch.manual_seed`` seeds both)."""
import torch

from torch_neuronx.neuron._device import _get_device_index, device_count
from torch_neuronx.runtime import ops as _ops


# Each device's generator is one C++ object for the process's life; looking it up again is a
# dispatcher call, which under a Python mode (the simulator's FakeTensorMode) costs ~0.4 ms.
_GENERATORS: dict[int, torch.Generator] = {}


def _default(index: int) -> torch.Generator:
    gen = _GENERATORS.get(index)
    if gen is None:
        gen = _GENERATORS[index] = _ops._default_generator(index)
    return gen


def _generator(device=None) -> torch.Generator:
    return _default(_get_device_index(device, optional=True, use="known"))



def __getattr__(name):
    # `torch.neuron.default_generators`, like torch.cuda's, built on access.
    if name == "default_generators":
        return tuple(_default(i) for i in range(device_count()))
    raise AttributeError(name)


def manual_seed(seed: int) -> None:
    """Seed the current neuron device's generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _default(i).manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a non-deterministic random number."""
    _generator().seed()


def seed_all() -> None:
    random_seed = _generator().seed()
    manual_seed_all(random_seed)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    _generator(device).set_state(new_state.cpu() if new_state.device.type != "cpu" else new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
