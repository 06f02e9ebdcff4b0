"""CPU is the oracle: helpers to run the same thing on CPU and on neuron and compare."""
import torch


def to_device(obj, device):
    """Move every tensor in a (nested) structure, keeping requires_grad leaves as leaves."""
    if isinstance(obj, torch.Tensor):
        moved = obj.detach().to(device)
        return moved.requires_grad_(obj.requires_grad) if obj.is_leaf else moved
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def assert_same(neuron_value, cpu_value, exact=True, **tolerances):
    """neuron_value (on neuron) equals cpu_value (on cpu): device, dtype, shape and numbers."""
    if isinstance(cpu_value, (list, tuple)):
        assert len(neuron_value) == len(cpu_value)
        for n, c in zip(neuron_value, cpu_value):
            assert_same(n, c, exact, **tolerances)
        return
    if not isinstance(cpu_value, torch.Tensor):
        assert neuron_value == cpu_value
        return
    assert neuron_value.device.type == "neuron", f"expected a neuron tensor, got {neuron_value.device}"
    if exact and not tolerances:
        tolerances = {"rtol": 0, "atol": 0}
    torch.testing.assert_close(neuron_value.cpu(), cpu_value, equal_nan=True, **tolerances)


def inductor_on_cpu(fn, **compile_kwargs):
    """``fn`` compiled by Inductor for CPU: the oracle of a graph compiled with backend="neuron",
    which runs the same generated code on the same bytes (equal bit for bit). CPU eager is not: on
    some machines Inductor's code for a Linear differs from eager in the last bits, and by how much
    depends on the vector ISA (ATEN_CPU_CAPABILITY)."""
    return torch.compile(fn, backend="inductor", **compile_kwargs)
