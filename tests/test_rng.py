"""RNG on neuron: seeding (torch.manual_seed, torch.neuron.manual_seed/seed_all), per-device
generators and their state, explicit generators, dropout and fork_rng."""
import torch

N = "neuron"


def test_rng_seeded_by_torch_and_neuron_manual_seed():
    torch.manual_seed(123)
    a = torch.randn(5, device=N)
    torch.manual_seed(123)
    b = torch.randn(5, device=N)
    assert torch.equal(a.cpu(), b.cpu())
    torch.neuron.manual_seed(7)
    c = torch.rand(4, device=N)
    torch.neuron.manual_seed(7)
    assert torch.equal(c.cpu(), torch.rand(4, device=N).cpu())
    assert torch.neuron.initial_seed() == 7


def test_rng_is_independent_of_the_cpu_stream():
    torch.manual_seed(0)
    x1 = torch.randn(3, device=N)
    x2 = torch.randn(3, device=N)
    torch.manual_seed(0)
    y1 = torch.randn(3, device=N)
    torch.randn(100)  # consuming the CPU stream must not shift the neuron stream
    y2 = torch.randn(3, device=N)
    assert torch.equal(x1.cpu(), y1.cpu()) and torch.equal(x2.cpu(), y2.cpu())
    # same seed, same numbers as CPU (the neuron generator wraps a CPU one)
    torch.manual_seed(5)
    assert torch.equal(torch.randn(6, device=N).cpu(), torch.randn(6, generator=torch.Generator().manual_seed(5)))


def test_rng_state_round_trip_and_per_device():
    torch.neuron.manual_seed_all(3)
    state = torch.neuron.get_rng_state()
    first = torch.rand(4, device=N).cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(first, torch.rand(4, device=N).cpu())
    states = torch.neuron.get_rng_state_all()
    assert len(states) == 4
    d1 = torch.rand(4, device="neuron:1").cpu()
    torch.neuron.set_rng_state_all(states)
    assert torch.equal(d1, torch.rand(4, device="neuron:1").cpu())
    # devices have their own streams
    torch.neuron.manual_seed(1)
    with torch.neuron.device(2):
        torch.neuron.manual_seed(2)
    torch.neuron.seed()
    torch.neuron.seed_all()
    assert len(torch.neuron.default_generators) == 4


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
