"""TORCH_NEURONX_EAGER_SEMANTICS=trainium: eager ops on neuron compute and behave as TorchNeuron's
eager mode does. Each test names, in its docstring, the TorchNeuron 0.1.0 file it follows (public
source, python_ops/...); the default (cpu) stays CPU-exact, which each test checks too. The oracle
is CPU PyTorch told to compute the way TorchNeuron does (in int32 or float32, the CPU generator)."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx.python_ops import trainium_semantics

from helpers import isolated
from helpers.oracle import assert_same

N = "neuron"
trainium = torch_neuronx.eager_semantics


def test_int64_computes_as_int32_and_is_cast_back():
    """python_ops/dtype_autocast.py: int64 tensors (with a dimension) are cast to int32, the op runs,
    the result is cast back to int64."""
    values = [2**31 - 1, 5]
    expected = (torch.tensor(values, dtype=torch.int32) + 1).to(torch.int64)
    assert expected.tolist() == [-2**31, 6]
    with trainium():
        got = torch.tensor(values, device=N) + 1
    assert_same(got, expected)
    assert_same(torch.tensor(values, device=N) + 1, torch.tensor(values) + 1)  # cpu semantics: exact
    assert (torch.tensor(values, device=N) + 1).cpu().tolist() == [2**31, 6]


def test_int64_in_place_reductions_and_indices_wrap_like_int32():
    """python_ops/dtype_autocast.py: in-place ops write the int32 result back into the int64 tensor;
    sums and products wrap as int32 arithmetic does; int64 indices still index."""
    big = torch.tensor([2**30, 2**30, 3, -7])
    as32 = big.to(torch.int32)
    with trainium():
        t = big.to(N)
        ptr = t.data_ptr()
        t.mul_(2)
        total, product = big.to(N).sum(), big.to(N).prod()
        picked = torch.gather(torch.arange(10.0, device=N), 0, torch.tensor([3, 1], device=N))
    assert t.data_ptr() == ptr and t.dtype == torch.int64
    assert_same(t, (as32 * 2).to(torch.int64))
    assert_same(total, as32.sum(dtype=torch.int32).to(torch.int64))
    assert_same(product, as32.prod(dtype=torch.int32).to(torch.int64))
    assert_same(picked, torch.tensor([3.0, 1.0]))


def test_float64_computes_as_float32_and_reports_float64():
    """python_ops/dtype_autocast.py and python_ops/jax/type_converter.py (float64 -> float32):
    float64 results carry float32 precision but report float64; a 0-dim tensor keeps float64."""
    t = torch.tensor([1e-10], dtype=torch.float64)
    with trainium():
        got = (t.to(N) + 1.0) - 1.0
        scalar = (torch.tensor(1e-10, dtype=torch.float64, device=N) + 1.0) - 1.0
        wide_sum = torch.ones(3, device=N).sum(dtype=torch.float64) + torch.tensor([1e-10], dtype=torch.float64,
                                                                                    device=N)
    assert got.dtype == torch.float64 and got.cpu().tolist() == [0.0]
    assert_same(got, ((t.float() + 1.0) - 1.0).double())
    assert scalar.item() == pytest.approx(1e-10, rel=1e-6)  # 0-dim: not cast (value.ndim != 0)
    assert wide_sum.dtype == torch.float64 and wide_sum.item() == 3.0  # dtype=float64 computed in float32
    assert_same((t.to(N) + 1.0) - 1.0, (t + 1.0) - 1.0)  # cpu semantics: float64 arithmetic


def test_out_of_64_bits_is_filled_with_the_32_bit_result():
    """python_ops/dtype_autocast.py, validate_output_dtypes with casting on (the JAX path): a float64 or
    int64 out= tensor is allowed and gets the result cast back."""
    a = torch.tensor([1.0, 1e-10], dtype=torch.float64)
    with trainium():
        out = torch.empty(2, dtype=torch.float64, device=N)
        result = torch.add(a.to(N), 1.0, out=out)
    assert result is out and out.dtype == torch.float64
    assert_same(out, (a.float() + 1.0).double())


def test_a_copy_that_changes_the_memory_format_raises():
    """python_ops/cast_policy.py, validate_neuron_memory_format (called by to_copy.py and contiguous.py):
    only contiguous or preserve memory formats; clone keeps any format."""
    x = torch.randn(2, 3, 8, 8)
    message = "Neuron tensors only support contiguous or preserve memory format"
    with trainium():
        d = x.to(N)
        with pytest.raises(RuntimeError, match=message):
            d.to(memory_format=torch.channels_last)
        with pytest.raises(RuntimeError, match=message):
            x.to(N, memory_format=torch.channels_last)
        kept = d.to(torch.float16)  # preserve: fine
        cloned = d.clone(memory_format=torch.channels_last)  # clone is not a cast: fine (tests/operations/test_clone.py)
    assert cloned.is_contiguous(memory_format=torch.channels_last) and kept.is_contiguous()
    assert d.to(memory_format=torch.channels_last).is_contiguous(memory_format=torch.channels_last)  # cpu semantics


def test_writing_into_a_non_contiguous_tensor_raises():
    """csrc/core/NeuronBindings.cpp (PrepareKernelTensors: contiguous tensors only), auto_registration.py (an
    in-place op runs with out=self) and torch_mlir/kernel.py (a provided output is the kernel's, unless its
    dtype is narrowed); tests/python_ops/test_add.py, test_add_inplace_non_contiguous_output."""
    message = "Cannot process non-contiguous tensors"
    with trainium():
        x = torch.ones(10, 10, device=N)
        with pytest.raises(RuntimeError, match=message):
            x[:, 3].add_(2)
        with pytest.raises(RuntimeError, match=message):
            x[:, 3] += 2
        with pytest.raises(RuntimeError, match=message):
            x.t().zero_()
        with pytest.raises(RuntimeError, match=message):
            torch.mul(x[:, 1], 2, out=x[:, 2])
        assert torch.equal(x.cpu(), torch.ones(10, 10))  # refused before anything was written
        x[3].add_(1)  # contiguous
        x[:, 3] = 5  # a copy: any strides
        x.t_()  # metadata only
        x.t_()
        x[:, :0].zero_()  # empty
        fresh = x.t() * 1  # transposed here, contiguous from TorchNeuron's kernel
        fresh.add_(0)
        wide = torch.ones(4, 4, dtype=torch.float64, device=N)
        wide[:, 1].add_(1)  # narrowed into a fresh tensor, then copied back
    expected = torch.ones(10, 10)
    expected[3] += 1
    expected[:, 3] = 5
    assert torch.equal(x.cpu(), expected) and wide.cpu()[:, 1].eq(2).all()
    x[:, 3].add_(2)  # cpu semantics: as CPU
    assert x.cpu()[0, 3] == 7


def test_dtypes_missing_from_the_jax_map_raise_on_device_ops():
    """type_converter_base.py and python_ops/jax/op_impl.py: float8_e4m3fn, uint16, uint32 and uint64 have
    no JAX dtype: ValueError("Unsupported PyTorch dtype"), no CPU fallback."""
    with trainium():
        with pytest.raises(ValueError, match="Unsupported PyTorch dtype: torch.uint16"):
            torch.ones(3, dtype=torch.uint16, device=N)
        f8 = torch.zeros(4).to(torch.float8_e4m3fn).to(N)  # a copy: no JAX kernel
        with pytest.raises(ValueError, match="Unsupported PyTorch dtype: torch.float8_e4m3fn"):
            torch.cat([f8, f8])
        ok = torch.cat([torch.zeros(2, dtype=torch.float8_e5m2, device=N)] * 2)  # in the map
    assert ok.shape == (4,)
    assert torch.ones(3, dtype=torch.uint16, device=N).cpu().tolist() == [1, 1, 1]  # cpu semantics


def test_empty_reductions_follow_torchneurons_identity_table():
    """python_ops/jax/config.py, ReductionOps: sum, prod, all, any give their identity and mean, std, var
    NaN (as CPU); max, min, amax, amin, argmax, argmin (no identity) raise on an empty input."""
    e = torch.zeros(0, 3)
    with trainium():
        d = e.to(N)
        sums, means = d.sum(0), d.mean(0)
        with pytest.raises(RuntimeError, match=r"Cannot perform aten::max\.dim on empty tensor"):
            d.max(1)
        with pytest.raises(RuntimeError, match="no identity value"):
            d.amax(1)
    assert_same(sums, e.sum(0))
    assert_same(means, e.mean(0))
    assert_same(d.max(1).values, e.max(1).values)  # cpu semantics: an empty result


def test_dropout_masks_come_from_the_cpu_generator():
    """python_ops/jax/ops/native_dropout.py: the mask is torch.bernoulli(empty bool, 1 - p) on the CPU
    generator, copied to the device; torch.neuron.manual_seed does not govern it."""
    x = torch.ones(64)
    torch.manual_seed(3)
    mask = torch.bernoulli(torch.empty(64, dtype=torch.bool), 0.75)
    expected = x * mask.float() * (1 / 0.75)
    torch.manual_seed(3)
    torch.neuron.manual_seed(99)  # does not matter under Trainium's semantics
    neuron_state = torch.neuron.get_rng_state()
    with trainium():
        y = F.dropout(x.to(N), 0.25, training=True)
    assert_same(y, expected)
    assert torch.equal(torch.neuron.get_rng_state(), neuron_state)


def test_ops_torchneuron_runs_on_the_cpu_keep_cpu_arithmetic_and_generator():
    """python_ops/cpu_fallback_registrations.py (linear algebra) and python_ops/base.py
    (_unhandled_cpu_fallback: random ops draw from the CPU generator): float64 stays float64 there."""
    a = torch.randn(4, 4, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)
    torch.manual_seed(5)
    expected_random = torch.randn(3)
    torch.manual_seed(5)
    with trainium():
        inverse = torch.linalg.inv(a.to(N))
        random = torch.randn(3, device=N)
        after = torch.rand(1)  # the CPU generator advanced by the neuron draw
    assert_same(inverse, torch.linalg.inv(a))  # float64 arithmetic on the host
    assert_same(random, expected_random)
    torch.manual_seed(5)
    torch.randn(3)
    assert torch.equal(after, torch.rand(1))


def test_training_runs_under_trainium_semantics_with_float32_arithmetic():
    """python_ops/dtype_autocast.py in a whole training step: a float64 model trains, in float32."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).double()
    x, y = torch.randn(16, 8, dtype=torch.float64), torch.randn(16, 4, dtype=torch.float64)
    reference = copy.deepcopy(model).float()
    F.mse_loss(reference(x.float()), y.float()).backward()
    with trainium():
        neuron_model = copy.deepcopy(model).to(N)
        loss = F.mse_loss(neuron_model(x.to(N)), y.to(N))
        loss.backward()
    assert loss.dtype == torch.float64 and neuron_model.weight.grad.dtype == torch.float64
    # float32 arithmetic, not float64 (differences in the last float32 bits: reduction order)
    torch.testing.assert_close(neuron_model.weight.grad.cpu(), reference.weight.grad.double(), rtol=1e-5, atol=1e-6)
    full = copy.deepcopy(model)
    F.mse_loss(full(x), y).backward()
    assert not torch.equal(neuron_model.weight.grad.cpu(), full.weight.grad)


def test_compiled_graphs_keep_their_own_rules():
    """neuron_dynamo_backend/backend.py: a compiled graph is one program with its own dtype pass; the
    eager rules do not reach into it (here: the inductor executor, CPU's arithmetic)."""
    def f(t):
        return (t + 1.0) - 1.0

    t = torch.tensor([1e-10, 2.0], dtype=torch.float64)
    torch._dynamo.reset()
    with trainium():
        got = torch.compile(f, backend="neuron")(t.to(N))
    torch._dynamo.reset()
    assert_same(got, torch.compile(f, backend="inductor")(t))


ENV_PROGRAM = """
    import torch
    t = torch.tensor([2**31 - 1, 5], device="neuron") + 1
    print("VALUES", t.cpu().tolist())
    print("SEMANTICS", __import__("torch_neuronx").python_ops.trainium_semantics.current())
"""


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_the_environment_variable_applies_it_and_a_bad_value_says_what_is_valid():
    on = isolated.run(ENV_PROGRAM, TORCH_NEURONX_EAGER_SEMANTICS="trainium")
    assert on.returncode == 0, on.stderr[-2000:]
    assert "VALUES [-2147483648, 6]" in on.stdout and "SEMANTICS trainium" in on.stdout
    off = isolated.run(ENV_PROGRAM, TORCH_NEURONX_EAGER_SEMANTICS="cpu")
    assert "VALUES [2147483648, 6]" in off.stdout and "SEMANTICS cpu" in off.stdout
    bad = isolated.run(ENV_PROGRAM, TORCH_NEURONX_EAGER_SEMANTICS="trainum")
    assert bad.returncode == 1
    assert "TORCH_NEURONX_EAGER_SEMANTICS='trainum' is invalid: use 'cpu'" in bad.stderr and "'trainium'" in bad.stderr


def test_the_context_manager_nests_and_restores():
    assert trainium_semantics.current() == "cpu"
    with trainium():
        assert trainium_semantics.current() == "trainium"
        with torch_neuronx.eager_semantics("cpu"):
            assert trainium_semantics.current() == "cpu"
            assert (torch.tensor([2**31 - 1], device=N) + 1).item() == 2**31
        assert (torch.tensor([2**31 - 1], device=N) + 1).item() == -2**31
    assert trainium_semantics.current() == "cpu"
    with pytest.raises(ValueError, match="'gpu' is not one of cpu, trainium"):
        with torch_neuronx.eager_semantics("gpu"):
            pass


def test_copy_between_two_neuron_cores_raises_and_is_a_would_fail_finding(collect):
    """csrc/utils/CopyUtils.cpp, copy_neuron_to_neuron: the runtime's device-to-device copy takes one
    core (its test_copy_neuron_to_neuron_different_devices_fails). By default the copy is CPU's and the
    report finds it; a copy on one core, or through the host, is silent."""
    src, dst = torch.randn(4, 4, device="neuron:0"), torch.empty(4, 4, device="neuron:1")
    torch.empty(4, 4, device="neuron:0").copy_(src)
    dst.copy_(src.cpu())
    assert not [f for f in collect().to_dict()["findings"] if f["kind"] == "cross-core-copy"]
    dst.copy_(src)
    assert torch.equal(dst.cpu(), src.cpu())
    (found,) = [f for f in collect().to_dict()["findings"] if f["kind"] == "cross-core-copy"]
    assert found["severity"] == "would-fail" and "neuron:0 to neuron:1" in found["details"][0]
    with trainium(), pytest.raises(RuntimeError, match="Device-to-device copy requires tensors on same Neuron core"):
        dst.copy_(src)
