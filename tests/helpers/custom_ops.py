"""A custom op defined outside torch, for tests of processes that must import it to see it."""
import torch


@torch.library.custom_op("neuron_test::scaled", mutates_args=())
def scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@scaled.register_fake
def _(x, factor):
    return torch.empty_like(x)
