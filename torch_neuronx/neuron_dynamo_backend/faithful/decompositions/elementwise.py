"""Distances and elementwise ops: cdist, pdist and their backwards, cumulative extremes, diagonals,
angle, hypot, zero-filled factories, frexp.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import math

import torch

from torch_neuronx.neuron_dynamo_backend.faithful.decompositions.reductions import reduction_identity


def _p_norm_last(diff, p):
    """The p-norm of ``diff`` over its last dimension (p = 0 counts nonzeros, inf takes the max)."""
    if p == 0:
        return (diff != 0).sum(-1).to(diff.dtype)
    if math.isinf(p):
        return diff.abs().amax(-1)
    if p == 1:
        return diff.abs().sum(-1)
    if p == 2:
        return torch.sqrt((diff * diff).sum(-1))
    return diff.abs().pow(p).sum(-1).pow(1.0 / p)


def cdist(x1, x2, p, compute_mode=None):
    """Every pair's p-norm distance, from the pairwise differences (batch, rows of x1, rows of x2, features)."""
    return _p_norm_last(x1.unsqueeze(-2) - x2.unsqueeze(-3), p)


def _row_pairs(x):
    """The rows (first, second) of each pair i < j of ``x``'s rows, in row-major order of the pairs."""
    return torch.triu_indices(x.shape[0], x.shape[0], 1, device=x.device)


def pdist(x, p=2):
    """The distances between each pair of rows i < j, in row-major order of the pairs."""
    first, second = _row_pairs(x)
    return _p_norm_last(x[first] - x[second], p)


def _p_norm_gradient(diff, distance, p):
    """d ||diff||_p / d diff (zero where the distance is)."""
    if p == 0:
        return torch.zeros_like(diff)
    if p == 1:
        return torch.sign(diff)
    safe = torch.where(distance == 0, torch.ones_like(distance), distance).unsqueeze(-1)
    if math.isinf(p):
        return torch.sign(diff) * (diff.abs() == distance.unsqueeze(-1)) * (distance != 0).unsqueeze(-1)
    if p == 2:
        gradient = diff / safe
    else:
        gradient = torch.where(diff == 0, 0, torch.sign(diff) * diff.abs().pow(p - 1) / safe.pow(p - 1))
    return gradient * (distance != 0).unsqueeze(-1)


def cdist_backward(grad, x1, x2, p, distances):
    """x1's gradient: each pair's gradient times d ||x1_i - x2_j||_p / d x1_i, summed over j."""
    each = grad.unsqueeze(-1) * _p_norm_gradient(x1.unsqueeze(-2) - x2.unsqueeze(-3), distances, p)
    return each.sum(-2)


def _cumulative_extreme(x, dim, largest: bool):
    """Running max (or min) along ``dim`` and where it was last reached: every prefix compared at
    once (position j counts for i when j <= i)."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    moved = x.movedim(dim, -1)
    size = moved.shape[-1]
    position = torch.arange(size, device=x.device)
    before = position.unsqueeze(0) <= position.unsqueeze(1)  # (i, j): j <= i
    pairs = moved.unsqueeze(-2).expand(*moved.shape[:-1], size, size)
    masked = torch.where(before, pairs, reduction_identity("amax" if largest else "amin", x.dtype))
    values = masked.amax(-1) if largest else masked.amin(-1)
    if x.dtype.is_floating_point:  # a NaN reached stays the running value, as in torch
        nan_seen = torch.cumsum(torch.isnan(moved).to(torch.int64), -1) > 0
        values = torch.where(nan_seen, math.nan, values)
    hit = before & ((pairs == values.unsqueeze(-1)) | (torch.isnan(pairs) & torch.isnan(values.unsqueeze(-1))))
    indices = torch.where(hit, position, -1).amax(-1)
    return values.movedim(-1, dim), indices.movedim(-1, dim)


def cummax(x, dim):
    return _cumulative_extreme(x, dim, largest=True)


def cummin(x, dim):
    return _cumulative_extreme(x, dim, largest=False)


def pdist_backward(grad, x, p, distances):
    """Each pair's gradient, +d/d(x_i) to its first row and -d/d(x_i) to its second."""
    first, second = _row_pairs(x)
    each = grad.unsqueeze(-1) * _p_norm_gradient(x[first] - x[second], distances, p)
    return torch.zeros_like(x).index_add(0, first, each).index_add(0, second, -each)


def diagonal(x, offset=0, dim1=0, dim2=1):
    """The (offset) diagonal of dims ``dim1``/``dim2``, moved last: a gather of the positions
    row * columns + row + offset of the two dims flattened."""
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    moved = x.movedim((dim1, dim2), (-2, -1))
    rows, columns = moved.shape[-2], moved.shape[-1]
    length = max(0, min(rows, columns - offset) if offset >= 0 else min(rows + offset, columns))
    row = torch.arange(length, device=x.device) + max(0, -offset)
    flat = moved.reshape(*moved.shape[:-2], rows * columns)
    return flat.index_select(-1, row * columns + row + offset)


def trace(x):
    """The sum of the main diagonal (torch-mlir would make it a diagonal op, which it cannot lower)."""
    return diagonal(x).sum()


def angle(x):
    """The argument of a real number: pi for negatives, 0 otherwise, NaN kept."""
    if x.is_complex():
        return NotImplemented
    x = x if x.dtype.is_floating_point else x.to(torch.get_default_dtype())
    signs = torch.where(x < 0, torch.full((), math.pi, dtype=x.dtype, device=x.device), torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, signs)


def hypot(x, y):
    """sqrt(x^2 + y^2), scaled by the larger magnitude so no square overflows."""
    big = torch.maximum(x.abs(), y.abs())
    small = torch.minimum(x.abs(), y.abs())
    ratio = torch.where(big == 0, torch.zeros_like(big), small / big)
    result = big * torch.sqrt(1 + ratio * ratio)
    return torch.where(torch.isinf(big), big, result)


def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    """``x`` with its diagonal replaced by ``src``: each diagonal element's flat position, from the
    same diagonal taken of the positions themselves, scattered into."""
    positions = torch.arange(x.numel(), device=x.device).view(x.shape).diagonal(offset, dim1, dim2)
    return x.reshape(-1).scatter(0, positions.reshape(-1), src.reshape(-1).to(x.dtype)).view(x.shape)


def diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(grad.new_zeros(input_sizes), grad, offset, dim1, dim2)


def new_empty_strided_as_zeros(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.zeros(size, dtype=dtype or x.dtype, device=device or x.device)


def empty_permuted_as_zeros(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.zeros(size, dtype=dtype, device=device)


def zero_tensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """torch's efficient zero tensor (what autograd gives an unused gradient) as plain zeros."""
    return torch.zeros(size, dtype=dtype, device=device)
