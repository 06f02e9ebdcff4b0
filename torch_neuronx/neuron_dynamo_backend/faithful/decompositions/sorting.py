"""Sorting, counting and order statistics: topk, argsort, histograms, mode, kthvalue, medians.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def topk(x, k, dim=-1, largest=True, sorted=True):
    """Any topk as the one form torch-mlir lowers (the largest, along the last dimension): the
    dimension moved last, smallest-k as largest-k of the negated values."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    dim = dim % x.dim()
    if dim == x.dim() - 1 and largest:
        return NotImplemented
    moved = x.movedim(dim, -1)
    values, indices = aten.topk(moved if largest else -moved, k, -1, True, True)
    values = values if largest else -values
    return values.movedim(-1, dim), indices.movedim(-1, dim)


def argsort(x, dim=-1, descending=False, *, stable=False):
    return torch.sort(x, dim=dim, descending=descending, stable=stable)[1]


def histc(x, bins=100, min=0, max=0):  # noqa: A002 - the op's own argument names
    """Counts in ``bins`` equal bins over [min, max] (the data's range when both are 0; widened by
    one each way when that range is empty); values outside are not counted, values at max go to the
    last bin."""
    low, high = float(min), float(max)
    if low == high:
        low, high = x.min(), x.max()
        empty = low == high
        low, high = torch.where(empty, low - 1, low), torch.where(empty, high + 1, high)
    position = torch.floor((x - low) * bins / (high - low)).to(torch.int64)
    position = torch.clamp(position, 0, bins - 1)
    counted = ((x >= low) & (x <= high)).to(x.dtype)
    hist = torch.zeros(bins, dtype=x.dtype, device=x.device)
    return hist.scatter_add(0, position.reshape(-1), counted.reshape(-1))


def mode(x, dim=-1, keepdim=False):
    """The most frequent value along ``dim`` and its position, as CPU's kernel gives them: every pair
    compared at once for the counts; of the values counted most often the smallest; its last
    position (CPU sorts each slice and takes the end of the run, and for slices of up to 16 elements
    its sort keeps equal values in order). A NaN equals nothing, so each counts once (NaN last in
    order, at its first position). Slices longer than 16: CPU's sort is not stable, and which
    position of the value it gives is not defined."""
    if x.dtype == torch.bool:
        return NotImplemented
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    dim = dim % x.dim()
    moved = x.movedim(dim, -1)
    size = moved.shape[-1]
    equal = moved.unsqueeze(-1) == moved.unsqueeze(-2)  # (..., i, j): x_i == x_j
    nan = torch.isnan(moved) if x.dtype.is_floating_point else torch.zeros_like(moved, dtype=torch.bool)
    counts = torch.where(nan, 1, equal.sum(-1))
    best = counts.amax(-1, keepdim=True)
    candidate = (counts == best) & ~nan
    big = torch.full((), math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).max, dtype=x.dtype,
                     device=x.device)
    value = torch.where(candidate, moved, big).amin(-1, keepdim=True)
    found = candidate.any(-1, keepdim=True)
    position = torch.arange(size, device=x.device)
    last = torch.where(moved == value, position, -1).amax(-1, keepdim=True)
    first_nan = torch.where(nan, position, size).amin(-1, keepdim=True)
    if x.dtype.is_floating_point:
        value = torch.where(found, value, torch.full((), math.nan, dtype=x.dtype, device=x.device))
    index = torch.where(found, last, first_nan)
    if not keepdim:
        value, index = value.squeeze(-1), index.squeeze(-1)
    else:
        value, index = value.movedim(-1, dim), index.movedim(-1, dim)
    return value, index


def _bin_edges(low, high, bins, dtype, device):
    """``bins + 1`` equal steps from ``low`` to ``high`` (0-d tensors or numbers), as CPU's linspace
    makes them: the first half from ``low``, the second back from ``high``."""
    low = torch.as_tensor(low, dtype=dtype, device=device)
    high = torch.as_tensor(high, dtype=dtype, device=device)
    step = (high - low) / bins
    i = torch.arange(bins + 1, device=device).to(dtype)
    return torch.where(i < (bins + 1) // 2, low + step * i, high - step * (bins - i))


def _outer_edges(x, ranges, count):
    """Each dimension's (leftmost, rightmost) edge: ``ranges`` (a flat list of pairs) or the data's
    minimum and maximum (0 and 1 when there is no data); widened by a half each way when they are
    equal. From the data, the edges are values computed in the graph (their shapes stay static)."""
    edges = []
    for d in range(count):
        if ranges is not None:
            low, high = (torch.full((), float(v), dtype=x.dtype, device=x.device) for v in ranges[2 * d:2 * d + 2])
        elif x.shape[0] == 0:
            low, high = (torch.full((), v, dtype=x.dtype, device=x.device) for v in (0.0, 1.0))
        else:
            low, high = x[:, d].amin(), x[:, d].amax()
        same = low == high
        edges.append((torch.where(same, low - 0.5, low), torch.where(same, high + 0.5, high)))
    return edges


def _histogramdd(x, edges, weight, density):
    """Counts (or weights) of the rows of ``x`` (N, D) in the bins between ``edges`` (one sorted 1-D
    tensor per dimension): a row's bin in each dimension is how many of its edges are at most its
    value, less one (the last bin holds its right edge); rows outside any dimension's edges, or NaN,
    are not counted. ``density``: divided by the total and by each bin's volume."""
    counts = [e.shape[0] - 1 for e in edges]
    flat = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    inside = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    for d, e in enumerate(edges):
        value = x[:, d]
        position = (e.unsqueeze(0) <= value.unsqueeze(1)).sum(1) - 1
        flat = flat * counts[d] + position.clamp(0, counts[d] - 1)
        inside = inside & (value >= e[0]) & (value <= e[-1])
    mass = torch.ones(x.shape[0], dtype=x.dtype, device=x.device) if weight is None else weight.reshape(-1).to(x.dtype)
    mass = torch.where(inside, mass, torch.zeros((), dtype=x.dtype, device=x.device))
    hist = torch.zeros(math.prod(counts), dtype=x.dtype, device=x.device).scatter_add(0, flat, mass)
    hist = hist.view(counts)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            shape = [1] * len(counts)
            shape[d] = counts[d]
            hist = hist / (e[1:] - e[:-1]).view(shape)
    return hist


def histogram(x, bins=100, *, range=None, weight=None, density=False):  # noqa: A002 - the op's own names
    """A 1-D histogram of every element: ``bins`` equal bins over ``range`` (the data's when none),
    or the given edges."""
    flat = x.reshape(-1, 1)
    if isinstance(bins, torch.Tensor):
        edges = bins.to(x.dtype)
        return _histogramdd(flat, [edges], weight, density), bins.clone()
    [(low, high)] = _outer_edges(flat, range, 1)
    edges = _bin_edges(low, high, bins, x.dtype, x.device)
    return _histogramdd(flat, [edges], weight, density), edges


def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    """The edges of histogramdd's equal bins in each dimension."""
    flat = x.reshape(-1, x.shape[-1])
    return [_bin_edges(low, high, count, x.dtype, x.device)
            for (low, high), count in zip(_outer_edges(flat, range, flat.shape[1]), bins)]


def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    flat = x.reshape(-1, x.shape[-1])
    return _histogramdd(flat, histogramdd_bin_edges(x, bins, range=range), weight, density)


def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histogramdd(x.reshape(-1, x.shape[-1]), [b.to(x.dtype) for b in bins], weight, density)


def _sorted_along(x, dim):
    """``x`` sorted ascending along ``dim`` (NaN last) and the positions each value came from."""
    return torch.sort(x, dim=dim)


def _nan_first(x, dim, keepdim):
    """Whether each slice holds a NaN, and the position of its first NaN."""
    nan = torch.isnan(x)
    return nan.any(dim, keepdim=keepdim), torch.argmax(nan.to(torch.uint8), dim, keepdim=keepdim)


def kthvalue(x, k, dim=-1, keepdim=False):
    """The k-th smallest value along ``dim`` and its position: the sorted slice's element k - 1."""
    if x.dim() == 0:
        return NotImplemented
    values, positions = _sorted_along(x, dim)
    pick = lambda t: t.narrow(dim, k - 1, 1) if keepdim else t.select(dim, k - 1)  # noqa: E731
    return pick(values), pick(positions)


def median_dim(x, dim, keepdim=False):
    """The lower median along ``dim`` (NaN, at its first position, where the slice holds one)."""
    if x.dim() == 0:
        return NotImplemented
    value, position = kthvalue(x, (x.shape[dim] - 1) // 2 + 1, dim, keepdim)
    if x.dtype.is_floating_point:
        has_nan, first_nan = _nan_first(x, dim, keepdim)
        value = torch.where(has_nan, torch.full((), math.nan, dtype=x.dtype, device=x.device), value)
        position = torch.where(has_nan, first_nan, position)
    return value, position


def median(x):
    """The lower median of every element; NaN if any is."""
    if x.numel() == 0:
        return NotImplemented
    return median_dim(x.reshape(-1), 0)[0]


def nanmedian_dim(x, dim, keepdim=False):
    """The lower median of each slice's non-NaN values (NaN last after sorting, so it is element
    (count - 1) // 2 of the sorted slice); NaN where the slice has none."""
    if x.dim() == 0 or not x.dtype.is_floating_point:
        return NotImplemented
    values, positions = _sorted_along(x, dim)
    count = (~torch.isnan(x)).sum(dim, keepdim=True)
    chosen = ((count - 1).clamp(min=0) // 2)
    value, position = values.gather(dim, chosen), positions.gather(dim, chosen)
    if not keepdim:
        value, position = value.squeeze(dim), position.squeeze(dim)
    return value, position


def nanmedian(x):
    if x.numel() == 0 or not x.dtype.is_floating_point:
        return NotImplemented
    return nanmedian_dim(x.reshape(-1), 0)[0]
