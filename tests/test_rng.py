"""RNG on neuron, as TorchNeuron: draws from CPU's default generator, per-device generators with a
16-byte Philox state, explicit generators, dropout and fork_rng."""
import pytest
import torch

N = "neuron"


def test_neuron_draws_come_from_cpus_stream_as_on_torchneuron():
    """TorchNeuron's random ops fall back to CPU and draw from CPU's default generator (its
    tests/device/test_rng_state.py marks an independent stream as an expected failure): after
    torch.manual_seed(s), neuron and CPU draws interleave in one stream."""
    torch.manual_seed(123)
    expected = torch.randn(12)
    torch.manual_seed(123)
    drawn = [torch.randn(3), torch.randn(3, device=N).cpu(), torch.randn(3, device="neuron:1").cpu(), torch.randn(3)]
    assert torch.equal(torch.cat(drawn), expected)
    torch.manual_seed(5)
    rand, normal = torch.rand(4, device=N), torch.empty(4, device=N).normal_()
    torch.manual_seed(5)
    assert torch.equal(rand.cpu(), torch.rand(4)) and torch.equal(normal.cpu(), torch.empty(4).normal_())


def test_neuron_seeds_do_not_move_the_cpu_stream():
    torch.manual_seed(42)
    cpu_only = torch.randn(5)
    torch.manual_seed(42)
    torch.neuron.manual_seed(123)
    torch.neuron.get_rng_state()
    torch.neuron.seed()
    assert torch.equal(torch.randn(5), cpu_only)


def test_rng_state_is_a_16_byte_philox_seed_and_offset():
    torch.manual_seed(2)
    assert torch.neuron.initial_seed() == 2  # torch.manual_seed seeds every neuron device too
    torch.neuron.manual_seed(42)
    state = torch.neuron.get_rng_state()
    assert (state.dtype, state.shape) == (torch.uint8, (16,))
    assert int.from_bytes(bytes(state[:8].tolist()), "little") == 42 and not any(state[8:].tolist())
    torch.neuron.manual_seed(100)
    torch.neuron.set_rng_state(state)
    assert torch.neuron.initial_seed() == 42
    states = torch.neuron.get_rng_state_all()
    assert len(states) == 4
    with torch.neuron.device(2):
        torch.neuron.manual_seed(7)
    assert torch.neuron.get_rng_state(2)[0] == 7 and torch.neuron.initial_seed() == 42
    torch.neuron.set_rng_state_all(states)
    assert torch.neuron.get_rng_state(2)[0] == 2  # as torch.manual_seed(2) left it
    torch.neuron.seed_all()
    assert len(torch.neuron.default_generators) == 4
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.neuron.set_rng_state(torch.get_rng_state())  # CPU's 5,056-byte state


def test_explicit_neuron_generator_and_dropout():
    g = torch.Generator(device=N).manual_seed(11)
    a = torch.randn(4, generator=g, device=N)
    g.manual_seed(11)
    assert torch.equal(a.cpu(), torch.randn(4, generator=g, device=N).cpu())
    assert g.device == torch.device("neuron:0")
    torch.manual_seed(0)
    d = torch.nn.functional.dropout(torch.ones(1000, device=N), 0.5)
    kept = (d > 0).float().mean().item()
    assert 0.4 < kept < 0.6
    torch.manual_seed(0)
    assert torch.equal(d.cpu(), torch.nn.functional.dropout(torch.ones(1000, device=N), 0.5).cpu())


def test_fork_rng_restores_neuron_state():
    torch.manual_seed(0)
    with torch.random.fork_rng(device_type="neuron"):
        torch.randn(10, device=N)
    after = torch.randn(3, device=N).cpu()
    torch.manual_seed(0)
    assert torch.equal(after, torch.randn(3, device=N).cpu())


def test_the_state_is_real_bytes_under_a_python_mode():
    # DTensor's LocalTensorMode and the simulator's FakeTensorMode read it inside their dispatch: a state
    # built through the dispatcher would be a tensor without data there (CI: parallelize_module failed).
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.neuron.manual_seed(7)
    expected = torch.neuron.get_rng_state()
    with FakeTensorMode():
        state = torch.neuron.get_rng_state()
    assert type(state) is torch.Tensor and torch.equal(state, expected)
