"""The kernels nn.SyncBatchNorm calls (python_ops/sync_batch_norm.py), which PyTorch has for CUDA only:
each against a CPU reference written from CUDA's definitions, against nn.BatchNorm on one process, and
nn.SyncBatchNorm training under torchrun against one CPU process with BatchNorm over the whole batch."""
import os

import pytest
import torch
import torch.nn.functional as F

from helpers import isolated

HERE = os.path.dirname(__file__)
N = "neuron"
EPS = 1e-5


def dims(x):
    return tuple(d for d in range(x.dim()) if d != 1)


def channels(x, t):
    return t.reshape([1, -1] + [1] * (x.dim() - 2))


# CUDA's definitions (aten/src/ATen/native/cuda/Normalization.cuh), on CPU tensors.
def ref_stats(x, eps):
    return x.mean(dims(x)), 1 / torch.sqrt(x.var(dims(x), unbiased=False) + eps)


def ref_gather(means, invstds, eps, counts):
    """Welford's merge of the ranks' statistics (batch_norm_reduce_statistics_kernel)."""
    mean, m2, n = torch.zeros(means.shape[1]), torch.zeros(means.shape[1]), 0.0
    for mean_j, invstd_j, n_j in zip(means, invstds, counts.tolist()):
        if n_j <= 0:
            continue
        var_j = 1 / invstd_j**2 - eps
        delta = mean_j - mean
        mean = mean + delta * n_j / (n + n_j)
        m2 = m2 + var_j * n_j + delta**2 * n * n_j / (n + n_j)
        n += n_j
    return mean, 1 / torch.sqrt(m2 / n + eps)


def ref_elemt(x, weight, bias, mean, invstd):
    out = (x - channels(x, mean)) * channels(x, invstd)
    return out * channels(x, weight) + channels(x, bias)


def ref_backward_reduce(dy, x, mean, invstd):
    sum_dy = dy.sum(dims(x))
    sum_dy_xmu = (dy * (x - channels(x, mean))).sum(dims(x))
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd, sum_dy


def ref_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    n = count.sum()
    factor = invstd * invstd * sum_dy_xmu / n
    return (dy - channels(x, sum_dy / n) - (x - channels(x, mean)) * channels(x, factor)) * channels(x, weight * invstd)


def on(device, *tensors):
    return [t.to(device) for t in tensors]


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 7), (2, 5, 4, 4), (2, 3, 2, 3, 4)])
def test_stats_and_elemt_equal_cudas_definitions_and_batch_norm_in_training(shape):
    torch.manual_seed(0)
    x, weight, bias = torch.randn(shape), torch.randn(shape[1]), torch.randn(shape[1])
    mean, invstd = torch.batch_norm_stats(x.to(N), EPS)
    assert mean.device.type == invstd.device.type == N
    for got, want in zip((mean, invstd), ref_stats(x, EPS)):
        torch.testing.assert_close(got.cpu(), want)
    out = torch.batch_norm_elemt(*on(N, x, weight, bias, mean, invstd), EPS)
    torch.testing.assert_close(out.cpu(), ref_elemt(x, weight, bias, mean.cpu(), invstd.cpu()))
    # one process: the same as BatchNorm in training
    torch.testing.assert_close(out.cpu(), F.batch_norm(x, None, None, weight, bias, training=True, eps=EPS))


def test_gather_stats_merge_the_ranks_as_cuda_does_and_leave_the_running_stats():
    torch.manual_seed(1)
    means, invstds = torch.randn(3, 4), torch.rand(3, 4) + 0.5
    counts = torch.tensor([6.0, 3.0, 10.0])
    running_mean, running_var = torch.zeros(4, device=N), torch.ones(4, device=N)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        torch.randn(2, 4, device=N), *on(N, means, invstds), running_mean, running_var, 0.1, EPS, counts.to(N))
    want_mean, want_invstd = ref_gather(means, invstds, EPS, counts)
    torch.testing.assert_close(mean.cpu(), want_mean)
    torch.testing.assert_close(invstd.cpu(), want_invstd)
    # TorchNeuron's kernel reads neither (CUDA's would update both in place)
    assert torch.equal(running_mean.cpu(), torch.zeros(4)) and torch.equal(running_var.cpu(), torch.ones(4))


def test_a_rank_with_a_zero_count_makes_the_variance_nan_as_on_torchneuron():
    # TorchNeuron zeroes that rank's invstd, then divides by it (its test: "some values may be NaN"); CUDA skips
    # the rank. nn.SyncBatchNorm drops empty ranks before the call, so training never meets it.
    means, invstds = torch.ones(2, 3, device=N), torch.ones(2, 3, device=N)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        torch.ones(2, 3, device=N), means, invstds, None, None, 0.1, EPS, torch.tensor([4.0, 0.0], device=N))
    assert torch.equal(mean.cpu(), torch.ones(3)) and invstd.isnan().all()


def test_gathered_stats_of_a_split_batch_are_the_whole_batchs():
    torch.manual_seed(2)
    x = torch.randn(10, 3, 5)
    parts = [x[:4], x[4:]]
    stats = [torch.batch_norm_stats(p.to(N), EPS) for p in parts]
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x.to(N), torch.stack([m for m, _ in stats]), torch.stack([i for _, i in stats]), None, None, 0.1, EPS,
        torch.tensor([20.0, 30.0], device=N))
    for got, want in zip((mean, invstd), ref_stats(x, EPS)):
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("with_weight", [True, False])
def test_the_backward_kernels_equal_cudas_definitions_and_batch_norms_gradient(with_weight):
    torch.manual_seed(3)
    x, dy = torch.randn(6, 3, 4), torch.randn(6, 3, 4)
    weight = torch.randn(3) if with_weight else None
    mean, invstd = ref_stats(x, EPS)
    # TorchNeuron returns all four, whatever input_g, weight_g and bias_g ask for
    reduced = torch.batch_norm_backward_reduce(*on(N, dy, x, mean, invstd), None if weight is None else weight.to(N),
                                               False, False, False)
    for got, want in zip(reduced, ref_backward_reduce(dy, x, mean, invstd)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    count = torch.tensor([x.numel() // 3], dtype=torch.int32)
    grad = torch.batch_norm_backward_elemt(*on(N, dy, x, mean, invstd), None if weight is None else weight.to(N),
                                           reduced[0], reduced[1], count.to(N))
    w = torch.ones(3) if weight is None else weight
    torch.testing.assert_close(grad.cpu(), ref_backward_elemt(dy, x, mean, invstd, w, reduced[0].cpu(),
                                                              reduced[1].cpu(), count), rtol=1e-5, atol=1e-5)
    # one process: BatchNorm's own input gradient
    leaf = x.clone().requires_grad_()
    F.batch_norm(leaf, None, None, w, None, training=True, eps=EPS).backward(dy)
    torch.testing.assert_close(grad.cpu(), leaf.grad, rtol=1e-4, atol=1e-5)


def test_the_out_overloads_fill_the_given_tensors():
    x = torch.randn(4, 3, 2).to(N)
    mean, invstd = torch.empty(0, device=N), torch.empty(0, device=N)
    got = torch.ops.aten.batch_norm_stats.out(x, EPS, out0=mean, out1=invstd)
    assert got[0] is mean and got[1] is invstd and mean.shape == (3,)
    torch.testing.assert_close(mean.cpu(), ref_stats(x.cpu(), EPS)[0])
    out = torch.empty(4, 3, 2, device=N)
    assert torch.ops.aten.batch_norm_elemt.out(x, None, None, mean, invstd, EPS, out=out) is out
    torch.testing.assert_close(out.cpu(), F.batch_norm(x.cpu(), None, None, training=True, eps=EPS))


def test_cpu_tensors_still_have_no_kernel_as_in_pytorch():
    with pytest.raises(NotImplementedError, match="batch_norm_stats"):
        torch.batch_norm_stats(torch.randn(2, 3), EPS)


@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.long)])
def test_sync_batch_norm_trains_under_torchrun_as_one_process_with_batch_norm_over_the_whole_batch(tmp_path, ranks):
    r = isolated.torchrun(os.path.join(HERE, "distributed", "sync_batch_norm.py"), ranks, RESULT_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr[-4000:]
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == [f"{rank} 3" for rank in range(ranks)]
