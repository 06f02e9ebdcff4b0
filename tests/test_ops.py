"""Eager ops on neuron against CPU: views, in-place, out=, lists, indexing, dtypes, attention."""
import pytest
import torch
import torch.nn.functional as F

from helpers.oracle import assert_same, to_device

N = "neuron"


def test_tensor_round_trip_is_a_copy():
    x = torch.randn(3, 4)
    y = x.to(N)
    assert y.device == torch.device("neuron:0") and y.is_neuron
    x.add_(1)
    assert not torch.equal(y.cpu(), x)


def test_view_writes_through_to_base():
    base_cpu = torch.arange(24.0).reshape(4, 6)
    base = base_cpu.to(N)
    for b in (base_cpu, base):
        v = b[1:3, ::2]
        v.mul_(-1)
        b.view(-1)[0] = 100
        b.t()[5, 3] = 7
    assert_same(base, base_cpu)
    assert base[1:3].untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_views_share_storage_and_version_counter():
    x = torch.zeros(4, 4, device=N)
    v = x.view(16)
    assert v._base is x
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    before = x._version
    v.add_(1)
    assert x._version > before
    assert torch.equal(x.cpu(), torch.ones(4, 4))
    parts = x.unbind(0)  # a multi-output view op through the fallback
    parts[2].fill_(5)
    assert x[2].cpu().eq(5).all()


@pytest.mark.parametrize("op", ["add_", "mul_", "clamp_", "exp_", "copy_"])
def test_inplace_on_non_contiguous_views(op):
    cpu = torch.randn(6, 8)
    dev = cpu.to(N)
    for t in (cpu, dev):
        v = t[::2, 1::3].transpose(0, 1)
        assert not v.is_contiguous()
        if op == "clamp_":
            v.clamp_(-0.1, 0.1)
        elif op == "exp_":
            v.exp_()
        elif op == "copy_":
            v.copy_(torch.full(v.shape, 3.0))
        else:
            getattr(v, op)(torch.full_like(v, 2.0))
    assert_same(dev, cpu)


LAYOUT_CASES = {  # operands made from two (2, 3, 4, 5) tensors, on each device
    "broadcast": lambda x, y: (x, y[0, 0, 0]),
    "broadcast both": lambda x, y: (x[0, :, :1], y[0, 0, :, :1]),
    "channels_last": lambda x, y: (x.contiguous(memory_format=torch.channels_last),
                                   y.contiguous(memory_format=torch.channels_last)),
    "mixed formats": lambda x, y: (x.contiguous(memory_format=torch.channels_last), y),
    "transposed": lambda x, y: (x.transpose(1, 3), y.transpose(1, 3)),
    "sliced": lambda x, y: (x[:, ::2], y[:, 1::2]),
    "empty": lambda x, y: (x[:, :0], y[:, :0]),
    "0-dim": lambda x, y: (x[0, 0, 0, 0], y[1, 1, 1, 1]),
    "int64": lambda x, y: ((x * 10).long(), (y * 10).long()),
}


@pytest.mark.parametrize("case", LAYOUT_CASES)
@pytest.mark.parametrize("op", [torch.add, torch.sub, torch.mul, torch.div])
def test_elementwise_binary_results_have_cpu_s_layout(op, case):
    """Values, shapes and strides (memory format) as on CPU, for views made on each device."""
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    make = LAYOUT_CASES[case]
    expected = op(*make(x, y))
    result = op(*make(x.to(N), y.to(N)))
    assert result.stride() == expected.stride()
    assert_same(result, expected)


@pytest.mark.parametrize("case", ["channels_last", "transposed", "sliced", "0-dim"])
@pytest.mark.parametrize("inplace", [False, True])
def test_silu_results_have_cpu_s_layout(case, inplace):
    x = torch.randn(2, 3, 4, 5)
    cpu, dev = LAYOUT_CASES[case](x, x)[0], LAYOUT_CASES[case](x.to(N), x.to(N))[0]
    expected, result = F.silu(cpu, inplace=inplace), F.silu(dev, inplace=inplace)
    assert result.stride() == expected.stride()
    assert_same(result, expected)
    assert_same(dev, cpu)


def test_elementwise_binary_result_lands_on_the_operands_device():
    a, b = torch.randn(64), torch.randn(64)
    on1 = [t.to("neuron:1") for t in (a, b)]
    before = [torch.neuron.memory_allocated(i) for i in (0, 1)]
    with torch.neuron.device(0):
        result = torch.add(*on1)
    assert result.device == torch.device("neuron:1")
    assert_same(result, a + b)
    after = [torch.neuron.memory_allocated(i) for i in (0, 1)]
    assert [n - o for n, o in zip(after, before)] == [0, 64 * 4]


def test_out_resizes_and_reallocates():
    a, b = torch.randn(64, 32), torch.randn(64, 32)
    for fn in (torch.add, torch.mul, torch.sub, torch.atan2, torch.maximum):
        out_cpu = torch.empty(0)
        out = torch.empty(0, device=N)
        fn(a, b, out=out_cpu)
        result = fn(a.to(N), b.to(N), out=out)
        assert result is out
        assert out.shape == (64, 32)
        assert_same(out, out_cpu)
    # matmul family out= with resize
    out = torch.empty(0, device=N)
    torch.mm(a.to(N), b.T.to(N), out=out)
    assert_same(out, a @ b.T, rtol=1e-6, atol=1e-5, exact=False)
    # out= into a view of a bigger tensor must write through, not reallocate
    big = torch.zeros(3, 64, 32, device=N)
    torch.add(a.to(N), b.to(N), out=big[1])
    assert_same(big[1], a + b)
    assert big[0].abs().sum().item() == 0


def test_out_resize_memory_is_accounted():
    before = torch.neuron.memory_allocated(0)
    out = torch.empty(0, device=N)
    ones = torch.ones(1000, device=N)
    torch.add(ones, 1, out=out)
    after = torch.neuron.memory_allocated(0)
    assert after - before == 8000  # 1000 float32 ones + 1000 float32 out
    del out
    assert torch.neuron.memory_allocated(0) - before == 4000


def test_tensorlist_ops():
    xs = [torch.randn(5) for _ in range(4)]
    ys = [torch.randn(5) for _ in range(4)]
    dxs, dys = to_device(xs, N), to_device(ys, N)
    assert_same(torch._foreach_add(dxs, dys), torch._foreach_add(xs, ys))
    torch._foreach_mul_(dxs, 3.0)
    torch._foreach_mul_(xs, 3.0)
    assert_same(dxs, xs)
    assert_same(torch.cat(dxs), torch.cat(xs))
    assert_same(torch.stack(dxs, 1), torch.stack(xs, 1))
    assert_same(list(torch.split(dxs[0], 2)), list(torch.split(xs[0], 2)))
    assert_same(list(torch.chunk(torch.cat(dxs), 3)), list(torch.chunk(torch.cat(xs), 3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_optimizer_pointwise_ops_match_cpu(dtype, layout):
    # lerp_, addcmul_, addcdiv_ and sqrt: what AdamW's foreach loop runs per parameter
    make = {"contiguous": lambda t: t, "transposed": lambda t: t.t(), "strided": lambda t: t[:, ::2]}[layout]
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(9, 6, generator=gen).to(dtype) for _ in range(3))
    c = c.abs() + 0.1
    results = {}
    for device in ("cpu", N):
        x = make(a.clone().to(device))
        y, z = make(b.to(device)), make(c.to(device))
        x.lerp_(y, 0.1).addcmul_(y, y, value=0.001).addcdiv_(y, z.sqrt(), value=-0.01)
        x.lerp_(torch.tensor(0.5, dtype=dtype), 0.3)  # a CPU 0-dim end beside a neuron self
        results[device] = (x, z.sqrt())
    assert_same(list(results[N]), list(results["cpu"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "0-dim"])
def test_inplace_ops_with_a_number_match_cpu(dtype, layout):
    # add_/mul_/div_ with a Python number: the optimizers' weight decay, beta2, eps, bias correction
    make = {"contiguous": lambda t: t, "transposed": lambda t: t.t(), "strided": lambda t: t[:, ::2],
            "0-dim": lambda t: t[1, 1]}[layout]
    calls = [("add_", (0.3,), {}), ("add_", (3,), {"alpha": 2}), ("mul_", (0.999,), {}), ("mul_", (2,), {}),
             ("div_", (0.7,), {}), ("div_", (4,), {}), ("add_", (1e-8,), {}), ("mul_", (True,), {})]
    base = (torch.randn(6, 8, generator=torch.Generator().manual_seed(0)) * 10).to(dtype)
    for name, args, kwargs in calls:
        outcome = {}
        for device in ("cpu", N):
            x = make(base.clone().to(device))
            version, stride = x._version, x.stride()
            try:
                returned = getattr(x, name)(*args, **kwargs)
            except RuntimeError as error:  # an integer tensor and a float number: both refuse alike
                outcome[device] = str(error)
                continue
            assert returned is x and x.stride() == stride and x._version == version + 1
            outcome[device] = x
        if isinstance(outcome["cpu"], str):
            assert outcome[N] == outcome["cpu"]
        else:
            assert_same(outcome[N], outcome["cpu"])


def test_inplace_op_with_a_number_keeps_gradients_and_refuses_complex():
    grads = {}
    for device in ("cpu", N):
        leaf = torch.linspace(-1, 1, 6, device=device, requires_grad=True)
        y = leaf * 1.5
        y.mul_(0.25).add_(2.0, alpha=0.5).div_(3.0)
        (y * y).sum().backward()
        grads[device] = leaf.grad
    assert_same(grads[N], grads["cpu"])
    with pytest.raises(RuntimeError, match="ComplexFloat can't be cast"):
        torch.ones(3, device=N).mul_(1j)


def test_sqrt_of_integers_matches_cpu():
    x = torch.arange(12).reshape(3, 4)
    assert_same(x.to(N).sqrt(), x.sqrt())
    assert_same(x.to(N).t().sqrt(), x.t().sqrt())


@pytest.mark.parametrize("index_device", ["neuron", "cpu"])
def test_indexing_with_neuron_and_cpu_indices(index_device):
    x = torch.randn(10, 6)
    d = x.to(N)
    idx = torch.tensor([0, 3, 3, 9])
    didx = idx.to(index_device)
    assert_same(d[didx], x[idx])
    assert_same(d[didx, 1:4], x[idx, 1:4])
    mask = x > 0
    assert_same(d[mask.to(index_device)], x[mask])
    d2, x2 = d.clone(), x.clone()
    d2[didx] = 0.5
    x2[idx] = 0.5
    assert_same(d2, x2)
    d2.index_put_((didx,), torch.ones(4, 6, device=N), accumulate=True)
    x2.index_put_((idx,), torch.ones(4, 6), accumulate=True)
    assert_same(d2, x2)
    assert_same(d.index_select(0, idx.to(N)), x.index_select(0, idx))
    assert_same(torch.gather(d, 1, idx[:2].view(2, 1).expand(2, 3).to(N)),
                torch.gather(x, 1, idx[:2].view(2, 1).expand(2, 3)))


def test_cpu_tensor_with_neuron_indices_gives_pytorch_s_message():
    """As for CUDA indices of a CPU tensor: PyTorch's own message, not a generic device mismatch."""
    x = torch.randn(5, 3)
    idx = torch.tensor([1, 3], device=N)
    message = r"indices should be either on cpu or on the same device as the indexed tensor \(cpu\)"
    with pytest.raises(RuntimeError, match=message):
        x[idx]
    with pytest.raises(RuntimeError, match=message):
        x[idx] = 1.0
    with pytest.raises(RuntimeError, match=message):
        x.index_put_((idx,), torch.ones(2, 3))
    with pytest.raises(RuntimeError, match=message):
        x[x.to(N) > 0]
    # a neuron value tensor sends the op to neuron, where the CPU tensor is a device mismatch in
    # TorchNeuron's words (its python_ops/base.py)
    with pytest.raises(RuntimeError, match="is on cpu device, expected neuron: all tensors must be on the same"):
        x.index_put_((idx.cpu(),), torch.ones(2, 3, device=N))


def test_indices_on_another_neuron_device_give_pytorch_s_message():
    """torch's test_advancedindex_mixed_devices_error: a tensor on neuron:0 indexed with a CPU index
    and an index on neuron:1 (as for CUDA: indices may be on the CPU or on the indexed tensor's device)."""
    x = torch.randn(3, 4, 4, 4, 3, device="neuron:0")
    ia, ib = torch.tensor([0, 2, 1]), torch.tensor([0, 2, 1], device="neuron:1")
    message = r"indices should be either on cpu or on the same device as the indexed tensor \(neuron:0\)"
    with pytest.raises(RuntimeError, match=message):
        x[:, ia, None, ib, 0]
    with pytest.raises(RuntimeError, match=message):
        x[ib]
    with pytest.raises(RuntimeError, match=message):
        x[ib] = 1.0
    with pytest.raises(RuntimeError, match=message):
        x.index_put_((ib,), torch.ones(3, 4, 4, 4, 3, device="neuron:0"))
    with pytest.raises(RuntimeError, match=message):
        x[torch.ones(3, dtype=torch.bool, device="neuron:1")]
    # CPU indices, and indices on the tensor's own device, are fine and equal CPU
    assert_same(x[:, ia, None, ib.to("neuron:0"), 0], x.cpu()[:, ia, None, ib.cpu(), 0])


@pytest.mark.parametrize("keepdim", [False, True])
def test_mode_with_out(keepdim):
    """mode.values has no CPU kernel: its generic kernel refused neuron ("mode only supports CPU,
    CUDA and XPU device type"), so it runs through the fallback as on CPU."""
    x = torch.randint(0, 4, (5, 7)).float()
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.long)
    torch.mode(x, 1, keepdim, out=(values, indices))
    d_values, d_indices = torch.empty(0, device=N), torch.empty(0, dtype=torch.long, device=N)
    result = torch.mode(x.to(N), 1, keepdim, out=(d_values, d_indices))
    assert result.values is d_values and result.indices is d_indices
    assert_same(d_values, values)
    assert_same(d_indices, indices)
    assert_same(torch.mode(x.to(N), 0), torch.mode(x, 0))


def test_batchnorm_running_stats_update_in_place():
    bn_cpu = torch.nn.BatchNorm2d(3)
    bn = torch.nn.BatchNorm2d(3).to(N)
    x = torch.randn(4, 3, 5, 5)
    for _ in range(3):
        y_cpu = bn_cpu(x)
        y = bn(x.to(N))
    assert_same(y, y_cpu, exact=False, rtol=1e-5, atol=1e-6)
    assert_same(bn.running_mean, bn_cpu.running_mean, exact=False, rtol=1e-6, atol=1e-7)
    assert_same(bn.running_var, bn_cpu.running_var, exact=False, rtol=1e-6, atol=1e-7)
    assert bn.num_batches_tracked.item() == 3


ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.bfloat16, torch.float32, torch.float64,
              torch.complex64, torch.complex128]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_dtypes(dtype):
    cpu = (torch.randn(5, 7) * 5).to(dtype) if not dtype.is_complex else torch.randn(5, 7, dtype=dtype)
    dev = cpu.to(N)
    assert dev.dtype == dtype
    assert_same(dev, cpu)
    if dtype != torch.bool:
        assert_same(dev + dev, cpu + cpu)
        assert_same(dev * 2, cpu * 2)
        assert_same(dev.sum(0), cpu.sum(0))
    assert_same(dev.t().contiguous(), cpu.t().contiguous())
    assert_same(dev == dev.flip(0), cpu == cpu.flip(0))
    if not dtype.is_complex:
        assert_same(dev.to(torch.float32), cpu.to(torch.float32))
    assert_same(dev[1:3].clone(), cpu[1:3].clone())


def test_complex_conj_and_neg_views():
    c = torch.randn(4, 3, dtype=torch.complex64)
    d = c.to(N)
    assert d.conj().is_conj()
    assert_same(d.conj(), c.conj())
    assert_same(d.conj().resolve_conj(), c.conj().resolve_conj())
    assert_same(d.conj() * 2, c.conj() * 2)
    assert_same(torch.view_as_real(d), torch.view_as_real(c))
    assert_same(d.imag, c.imag)
    assert_same(d.conj().imag.neg(), c.conj().imag.neg())
    out = torch.empty_like(d)
    out.copy_(d.conj())
    assert_same(out, c.conj().resolve_conj())
    torch.testing.assert_close(d.conj().cpu(), c.conj(), rtol=0, atol=0)


def test_scalars_and_zero_dim():
    x = torch.randn(3, 3)
    d = x.to(N)
    assert_same(d + torch.tensor(2.0), x + 2.0)  # 0-dim CPU tensor is allowed, as on CUDA
    assert d.max().item() == x.max().item()
    assert_same(d * 1.5 + 2, x * 1.5 + 2)
    assert bool((d > 100).any()) is False


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_forward_backward(causal):
    q, k, v = (torch.randn(2, 4, 16, 32, requires_grad=True) for _ in range(3))
    dq, dk, dv = to_device([q, k, v], N)
    out_cpu = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=causal)
    assert_same(out, out_cpu)
    grad = torch.randn_like(out_cpu)
    out_cpu.backward(grad)
    out.backward(grad.to(N))
    for n, c in ((dq, q), (dk, k), (dv, v)):
        assert_same(n.grad, c.grad)


def test_sdpa_with_mask():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.randn(8, 8) > 0
    mask[:, 0] = True
    assert_same(F.scaled_dot_product_attention(*to_device([q, k, v, mask], N)[:3], attn_mask=mask.to(N)),
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_conv_and_pooling():
    x = torch.randn(2, 3, 16, 16)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    dconv = torch.nn.Conv2d(3, 8, 3, padding=1)
    dconv.load_state_dict(conv.state_dict())
    dconv.to(N)
    assert_same(dconv(x.to(N)), conv(x))
    assert_same(F.max_pool2d(x.to(N), 2), F.max_pool2d(x, 2))
    tconv = torch.nn.ConvTranspose2d(3, 4, 2, stride=2)
    assert_same(tconv.to(N)(x.to(N)), tconv.cpu()(x))


def test_factories_on_neuron():
    for make in (lambda d: torch.zeros(3, 2, device=d), lambda d: torch.ones(5, dtype=torch.int64, device=d),
                 lambda d: torch.arange(10, device=d), lambda d: torch.full((2, 2), 7.0, device=d),
                 lambda d: torch.eye(3, device=d), lambda d: torch.linspace(0, 1, 5, device=d),
                 lambda d: torch.empty(0, device=d)):
        result = make(N)
        assert result.device == torch.device("neuron:0")
        if result.numel():
            assert_same(result, make("cpu"))
    with torch.neuron.device(1):
        t = torch.zeros(2, device=N)
    assert t.device == torch.device("neuron:1")
    assert torch.zeros(2, device="neuron:2").device.index == 2
    assert torch.arange(3, device="neuron:3").device.index == 3


@pytest.mark.parametrize("op", [torch.amax, torch.amin])
def test_an_out_of_another_dtype_is_torchneurons_type_error(op):
    # TorchNeuron's test_amax_amin: a TypeError in torch's dtype names (CPU raises a RuntimeError)
    x = torch.randint(0, 10, (3, 4), dtype=torch.int32)
    with pytest.raises(TypeError, match=r"^Expected the dtype for input and out to match, but got torch.int32 for "
                                        r"input's dtype and torch.float32 for out's dtype.$"):
        op(x.to(N), out=torch.empty((), dtype=torch.float32, device=N))
    out = torch.empty((), dtype=torch.int32, device=N)
    assert op(x.to(N), out=out) is out and torch.equal(out.cpu(), op(x))


def test_softmax_half_to_float_gives_the_float_softmax_as_torchneuron():
    # CPU refuses half_to_float; TorchNeuron (its test_unary_ops) returns float32
    x = torch.randn(2, 3, dtype=torch.float16)
    result = torch.ops.aten._softmax.default(x.to(N), 1, True)
    assert result.dtype == torch.float32 and result.device.type == "neuron"
    assert torch.equal(result.cpu(), torch.softmax(x.float(), 1))
    assert torch.equal(torch.ops.aten._softmax.default(x.to(N), 1, False).cpu(), torch.softmax(x, 1))


@pytest.mark.parametrize("mask", [(True, False, True), (False, False, True), (True, True, False), (False, True, False)])
def test_convolution_backward_leaves_the_gradients_it_was_not_asked_for_undefined(mask):
    # As TorchNeuron's kernel does; CPU's computes the weight's gradient whatever the mask says.
    torch.manual_seed(0)
    grad, x, w = torch.randn(2, 2, 10, 10), torch.randn(2, 3, 10, 10), torch.randn(2, 3, 3, 3)

    def backward(*tensors):
        return torch.ops.aten.convolution_backward(*tensors, [2], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   list(mask))
    cpu, neuron = backward(grad, x, w), backward(*(t.to(N) for t in (grad, x, w)))
    for wanted, got, expected in zip(mask, neuron, cpu):
        if wanted:
            assert got.device.type == N and torch.equal(got.cpu(), expected)
        else:
            assert got is None
    # autograd asks for what requires grad only, and gets it
    conv = torch.nn.Conv2d(3, 2, 3).to(N).requires_grad_(mask[1])
    xn = x.to(N).requires_grad_(mask[0])
    if mask[0] or mask[1]:
        conv(xn).sum().backward()
        assert (xn.grad is not None) == mask[0] and (conv.weight.grad is not None) == mask[1]
