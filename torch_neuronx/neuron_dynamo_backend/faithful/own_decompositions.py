"""Decompositions written from each operator's mathematics, into ops that lower to StableHLO: the
counterparts of TorchNeuron's own compile decompositions, and of what its private pipeline must
legalize where torch has no decomposition. :mod:`.decompositions` holds the table.

Each runs while AOTAutograd traces (static shapes), so Python arithmetic on sizes is free, and a
function may return ``NotImplemented`` to leave a case it does not cover to the op itself.
"""
from __future__ import annotations

import functools
import itertools
import math
import operator

import torch

aten = torch.ops.aten


# ---- views and indexing ---------------------------------------------------------------------------

def _strided_positions(size, stride, offset: int, device) -> torch.Tensor:
    """The storage position of every element of a strided view: offset + sum(i_d * stride_d)."""
    position = torch.full((), offset, dtype=torch.int64, device=device)
    for dim, (count, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = count
        position = position + (torch.arange(count, device=device) * step).view(shape)
    return position.expand(list(size))


def _view_positions(x, size, stride, storage_offset):
    """The positions in ``x`` (contiguous) flattened that ``as_strided(size, stride, storage_offset)`` reads."""
    offset = (x.storage_offset() if storage_offset is None else storage_offset) - x.storage_offset()
    return _strided_positions(size, stride, offset, x.device)


def as_strided(x, size, stride, storage_offset=None):
    """A view of ``x``'s storage as a gather of the positions the view reads."""
    if not x.is_contiguous():
        return NotImplemented
    return x.reshape(-1)[_view_positions(x, size, stride, storage_offset)]


def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """``x`` with the positions a strided view reads replaced by ``src``."""
    if not x.is_contiguous():
        return NotImplemented
    positions = _view_positions(x, size, stride, storage_offset).reshape(-1)
    return x.reshape(-1).scatter(0, positions, src.reshape(-1).to(x.dtype)).view(x.shape)


def index_copy(x, dim, index, source):
    """Rows ``index`` along ``dim`` replaced by ``source``'s: a scatter."""
    if x.dim() == 0:
        return source.reshape(()).to(x.dtype).clone()
    dim = dim % x.dim()
    source = source.reshape([1] * x.dim()) if source.dim() == 0 else source
    shape = [1] * source.dim()
    shape[dim] = -1
    return x.scatter(dim, index.reshape(shape).expand(source.shape), source.to(x.dtype))


def index_put(x, indices, values, accumulate=False):
    """``x[indices] = values`` (or ``+=``) for integer indices on adjacent dimensions, as a scatter on
    ``x`` flattened to (indexed positions, the rest). Boolean masks (their size depends on the data)
    and indices split by a slice are left to the op."""
    indices = list(indices)
    while indices and indices[-1] is None:
        indices.pop()
    used = [i for i, index in enumerate(indices) if index is not None]
    if (not used or used != list(range(used[0], used[-1] + 1))
            or any(indices[i].dtype in (torch.bool, torch.uint8) for i in used)
            or (accumulate and x.dtype == torch.bool)):
        return NotImplemented
    first, count = used[0], len(used)
    moved = x.movedim(list(range(first, first + count)), list(range(count)))  # indexed dims first
    sizes = moved.shape[:count]
    tensors = torch.broadcast_tensors(*[indices[i] for i in used])
    linear = torch.zeros_like(tensors[0], dtype=torch.int64)
    for tensor, size in zip(tensors, sizes):
        linear = linear * size + torch.where(tensor < 0, tensor + size, tensor)
    batch = list(tensors[0].shape)
    before, after = list(x.shape[:first]), list(x.shape[first + count:])
    # values broadcast to x[indices]'s shape (before, batch, after), then batch moved to the front
    values = values.to(x.dtype).expand(before + batch + after)
    values = values.movedim(list(range(len(before), len(before) + len(batch))), list(range(len(batch))))
    rest = math.prod(before + after)
    flat = moved.reshape(math.prod(sizes), rest)
    rows = linear.reshape(-1, 1).expand(-1, rest)
    values = values.reshape(-1, rest)
    result = flat.scatter_add(0, rows, values) if accumulate else flat.scatter(0, rows, values)
    return result.reshape(moved.shape).movedim(list(range(count)), list(range(first, first + count)))


def unsafe_masked_index(x, mask, indices, fill):
    """``x[indices]`` where ``mask`` holds, ``fill`` elsewhere (indices there may be out of range: clamped)."""
    clamped = [None if index is None else torch.clamp(index, -x.shape[d], x.shape[d] - 1)
               for d, index in enumerate(indices)]
    return torch.where(mask, aten.index.Tensor(x, clamped), fill)


def empty_as_zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """Uninitialized memory, as zeros: XLA cannot compile StableHLO's ``tensor.empty``."""
    return torch.zeros(size, dtype=dtype, device=device)


def new_empty_as_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.zeros(size, dtype=dtype or x.dtype, device=device or x.device)


def empty_strided_as_zeros(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.zeros(size, dtype=dtype, device=device)


def nonzero_static(x, *, size, fill_value=-1):
    """The first ``size`` coordinates of nonzero elements, padded with ``fill_value``: each nonzero
    element is scattered to the row its running count gives; the rest go to a row that is dropped."""
    ndim = x.dim()
    nonzero = (x != 0).reshape(-1)
    count = nonzero.numel()
    rank = torch.cumsum(nonzero.to(torch.int64), 0) - 1
    row = torch.where(nonzero & (rank < size), rank, size)
    flat = torch.arange(count, device=x.device)
    coordinates = [(flat // math.prod(x.shape[d + 1:])) % x.shape[d] for d in range(ndim)]
    coordinates = torch.stack(coordinates, 1) if ndim else flat.new_zeros((count, 0))
    out = torch.full((size + 1, ndim), fill_value, dtype=torch.int64, device=x.device)
    return out.scatter(0, row.view(-1, 1).expand(count, ndim), coordinates)[:size]


def value_selecting_reduction_backward(grad, dim, indices, sizes, keepdim):
    """The gradient of max/min along ``dim``: each output's gradient goes to the position it chose."""
    if len(sizes) == 0:
        return grad.clone()
    if not keepdim:
        grad, indices = grad.unsqueeze(dim), indices.unsqueeze(dim)
    return grad.new_zeros(sizes).scatter(dim, indices, grad)


def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Each looked-up row's gradient added to its weight row; the padding row gets none; with
    ``scale_grad_by_freq`` each is divided by how often its index occurs."""
    width = grad.shape[-1]
    index = indices.reshape(-1)
    rows = grad.reshape(-1, width)
    if padding_idx >= 0:
        rows = rows * (index != padding_idx).to(rows.dtype).unsqueeze(1)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=rows.dtype, device=rows.device).scatter_add(
            0, index, torch.ones_like(index, dtype=rows.dtype))
        rows = rows / counts[index].unsqueeze(1)
    out = torch.zeros(num_weights, width, dtype=grad.dtype, device=grad.device)
    return out.scatter_add(0, index.view(-1, 1).expand(-1, width), rows)


def _bags(indices, offsets, bags, padding_idx):
    """Which positions of ``indices`` each bag holds, padding left out: (bags, positions). Bag b runs
    from offsets[b] to the next offset (the last, without a closing offset, to the end)."""
    count = indices.shape[0]
    ends = torch.cat([offsets[1:], torch.full((1,), count, dtype=offsets.dtype, device=offsets.device)])[:bags]
    position = torch.arange(count, device=indices.device)
    member = (offsets[:bags].unsqueeze(-1) <= position) & (position < ends.unsqueeze(-1))
    if padding_idx is not None and padding_idx >= 0:
        member = member & (indices != padding_idx)
    return member


def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Each bag's rows of ``weight`` summed (times ``per_sample_weights``), averaged, or their
    maximum per column (the first row reaching it; NaN when the bag's first row has it, as CPU's
    running comparison gives), every (bag, position) pair at once; an empty bag is zeros. Also
    each position's bag, each bag's size (zeros for a sum, as on CPU) and, for the maximum, the row
    chosen per column (for a mean, the sizes again, as on CPU)."""
    if indices.dim() != 1:  # (``sparse`` is the gradient's layout: the bags are the same)
        return NotImplemented
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    member = _bags(indices, offsets, bags, padding_idx)
    rows = weight.index_select(0, indices)  # (positions, width)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(weight.dtype).unsqueeze(-1)
    inside = member.unsqueeze(-1)
    zero = torch.zeros((), dtype=weight.dtype, device=weight.device)
    size = member.sum(-1)
    starts = offsets[:bags].unsqueeze(-1) <= torch.arange(indices.shape[0], device=indices.device)
    offset2bag = (starts.sum(0) - 1).clamp(min=0)  # each position's bag (CPU leaves it empty for some sums)
    if mode in (0, 1):
        out = torch.where(inside, rows.unsqueeze(0), zero).sum(1)
        if mode == 1:
            out = out / size.clamp(min=1).unsqueeze(-1).to(weight.dtype)
            return out, offset2bag, size, size.clone()
        return out, offset2bag, torch.zeros_like(size), torch.zeros_like(size)
    position = torch.arange(indices.shape[0], device=indices.device)
    spread = rows.unsqueeze(0)  # (1, positions, width)
    nan = torch.isnan(spread)
    low = torch.full((), -math.inf, dtype=weight.dtype, device=weight.device)
    best = torch.where(inside & ~nan, spread, low).amax(1, keepdim=True)  # (bags, 1, width)
    first = torch.where(member, position, indices.shape[0]).amin(-1)  # each bag's first position
    reached = inside & (spread == best)
    chosen = torch.where(reached, position.view(1, -1, 1), indices.shape[0]).amin(1)  # (bags, width)
    first_row = rows.index_select(0, first.clamp(max=indices.shape[0] - 1))
    first_nan = torch.isnan(first_row)
    chosen = torch.where(first_nan, first.unsqueeze(-1), chosen)
    out = torch.where(first_nan, first_row, best.squeeze(1))
    empty = (size == 0).unsqueeze(-1)
    out = torch.where(empty, zero, out)
    chosen_rows = indices.index_select(0, chosen.clamp(max=indices.shape[0] - 1).reshape(-1)).view(chosen.shape)
    return out, offset2bag, size, torch.where(empty, 0, chosen_rows)


def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    """The weight's gradient: each position's bag's gradient (times its weight, or divided by the
    bag's size) added to its row, padding left out; for the maximum, each column's gradient to the
    row chosen. ``scale_grad_by_freq``: each row's divided by how often it occurs in ``indices``, as
    embedding's backward does (CPU's embedding_bag kernel divides by the count of the row at the
    position of this row's rank among the distinct rows in the sorted indices, which agrees only
    where every row occurs equally often)."""
    if sparse:
        return NotImplemented
    bags, width = grad.shape
    member = _bags(indices, offsets, bags, padding_idx)
    out = torch.zeros(num_weights, width, dtype=grad.dtype, device=grad.device)
    if mode == 2:
        nonempty = (member.sum(-1) > 0).unsqueeze(-1)
        return out.scatter_add(0, maximum_indices, torch.where(nonempty, grad, 0))
    scale = member.to(grad.dtype)
    if mode == 1:
        scale = scale / member.sum(-1, keepdim=True).clamp(min=1).to(grad.dtype)
    each = scale.t() @ grad  # (positions, width): each position's bag's gradient, scaled
    if per_sample_weights is not None:
        each = each * per_sample_weights.to(grad.dtype).unsqueeze(-1)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=grad.dtype, device=grad.device).scatter_add(
            0, indices, torch.ones_like(indices, dtype=grad.dtype))
        each = each / counts[indices].unsqueeze(-1)
    return out.scatter_add(0, indices.view(-1, 1).expand(-1, width), each)


def embedding_renorm(weight, indices, max_norm, norm_type):
    """``weight`` with each row that ``indices`` looks up, and whose ``norm_type`` norm exceeds
    ``max_norm``, scaled by max_norm / (norm + 1e-7) (what embedding's ``max_norm`` does in place)."""
    looked_up = (indices.reshape(-1, 1) == torch.arange(weight.shape[0], device=weight.device)).any(0)
    norm = torch.linalg.vector_norm(weight, norm_type, dim=1, keepdim=True)
    scale = torch.where(looked_up.unsqueeze(-1) & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return weight * scale.to(weight.dtype)


def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """Each weight's gradient (sum mode): its bag's gradient dotted with its row; zero for padding."""
    if mode != 0:
        return NotImplemented
    member = _bags(indices, offsets, grad.shape[0], padding_idx)
    each = torch.where(member.unsqueeze(-1), grad.unsqueeze(1), 0).sum(0)  # (positions, width)
    return (each * weight.index_select(0, indices).to(grad.dtype)).sum(-1)


# ---- sorting and counting -------------------------------------------------------------------------

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


# ---- arithmetic -----------------------------------------------------------------------------------

def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.full((), s, dtype=dtype or torch.get_default_dtype(), device=device)


def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """(sum |x|^ord)^(1/ord) over ``dim``; max |x| for inf, min for -inf, the count of nonzeros for 0."""
    if dtype is not None:
        x = x.to(dtype)
    if x.is_complex():
        return NotImplemented
    dims = list(range(x.dim())) if dim is None else list(dim)
    magnitude = x.abs()
    if ord == math.inf:
        return torch.amax(magnitude, dims, keepdim)
    if ord == -math.inf:
        return torch.amin(magnitude, dims, keepdim)
    if ord == 0:
        return torch.sum((magnitude != 0).to(magnitude.dtype), dims, keepdim)
    if ord == 1:
        return torch.sum(magnitude, dims, keepdim)
    if ord == 2:
        return torch.sqrt(torch.sum(magnitude * magnitude, dims, keepdim))
    return torch.pow(torch.sum(torch.pow(magnitude, ord), dims, keepdim), 1.0 / ord)


def sigmoid_backward(grad, out):
    """d sigmoid = y (1 - y)."""
    return grad * (1 - out) * out


def silu_backward(grad, x):
    """d (x sigmoid(x)) = s (1 + x (1 - s))."""
    s = torch.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


def rshift_scalar(x, shift):
    """``x >> shift`` for integers: an arithmetic shift."""
    if x.dtype.is_floating_point or x.dtype == torch.bool:
        return NotImplemented
    return torch.bitwise_right_shift(x, shift)


def foreach_pow_scalar(tensors, exponent):
    return [torch.pow(t, exponent) for t in tensors]


def linear_backward(x, grad, weight, output_mask):
    """y = x W^T + b: dx = dy W, dW = dy^T x (over every leading dimension), db = sum dy."""
    rows = grad.reshape(-1, grad.shape[-1])
    grad_input = grad @ weight if output_mask[0] else None
    grad_weight = rows.t() @ x.reshape(-1, x.shape[-1]) if output_mask[1] else None
    grad_bias = rows.sum(0) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """Matmuls over groups: 3D x 3D batched; 2D x 3D with ``offs`` the end row of each group of
    ``a``'s rows; 2D x 2D with ``offs`` the end of each group along K. Each group is a masked full
    product (static shapes: no slicing by data)."""
    if bias is not None or (out_dtype is not None and out_dtype != a.dtype):
        return NotImplemented
    if a.dim() == 3 and b.dim() == 3 and offs is None:
        return torch.bmm(a, b)
    if offs is None or a.dim() != 2:
        return NotImplemented
    ends = offs.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    if b.dim() == 3:  # groups of rows: out[rows of g] = a[rows of g] @ b[g]
        row = torch.arange(a.shape[0], device=a.device).view(1, -1, 1)
        member = ((row >= starts.view(-1, 1, 1)) & (row < ends.view(-1, 1, 1))).to(a.dtype)  # (G, M, 1)
        return (torch.matmul(a.unsqueeze(0), b) * member).sum(0)
    if b.dim() == 2:  # groups along K: out[g] = a[:, K of g] @ b[K of g, :]
        k = torch.arange(a.shape[1], device=a.device).view(1, -1)
        member = ((k >= starts.view(-1, 1)) & (k < ends.view(-1, 1))).to(a.dtype)  # (G, K)
        return torch.matmul(a.unsqueeze(0) * member.unsqueeze(1), b)
    return NotImplemented


# ---- attention ------------------------------------------------------------------------------------

def _attention_scores(query, key, attn_bias, is_causal, scale):
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if heads != kv_heads:  # grouped-query attention: each key/value head serves heads // kv_heads queries
        key = key.repeat_interleave(heads // kv_heads, dim=-3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        keep = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_bias is not None:
        scores = (scores.masked_fill(~attn_bias, float("-inf")) if attn_bias.dtype == torch.bool
                  else scores + attn_bias)
    return scores, scale


def _repeat_heads(t, heads):
    return t.repeat_interleave(heads // t.shape[-3], dim=-3) if t.shape[-3] != heads else t


def _sum_heads(grad, kv_heads):
    """A gradient over repeated key/value heads, summed back to each head."""
    heads = grad.shape[-3]
    if heads == kv_heads:
        return grad
    return grad.unflatten(-3, (kv_heads, heads // kv_heads)).sum(-3)


def attention_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                      return_debug_mask=False, *, scale=None):
    """softmax(q k^T * scale + bias) v, and the log-sum-exp of each row (what the backward needs):
    TorchNeuron's fallback for its fused attention when no NKI kernel applies."""
    if dropout_p > 0.0:
        return NotImplemented
    scores, _ = _attention_scores(query, key, attn_bias, is_causal, scale)
    logsumexp = torch.logsumexp(scores, -1)
    weights = torch.exp(scores - logsumexp.unsqueeze(-1))
    output = torch.matmul(weights, _repeat_heads(value, query.shape[-3]))
    empty = query.new_empty(0)
    return (output, logsumexp, empty, empty, query.shape[-2], key.shape[-2], empty.to(torch.int64),
            empty.to(torch.int64), empty)


def attention_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                       cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    """The attention's gradients, from the saved output and log-sum-exp: with P the weights,
    dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = dS K * scale, dK = dS^T Q * scale."""
    if dropout_p > 0.0:
        return NotImplemented
    heads = query.shape[-3]
    scores, scale = _attention_scores(query, key, attn_bias, is_causal, scale)
    weights = torch.exp(scores - logsumexp.unsqueeze(-1))
    value_full, key_full = _repeat_heads(value, heads), _repeat_heads(key, heads)
    grad_weights = torch.matmul(grad_out, value_full.transpose(-2, -1))
    grad_scores = weights * (grad_weights - (grad_out * out).sum(-1, keepdim=True))
    grad_query = torch.matmul(grad_scores, key_full) * scale if grad_input_mask[0] else None
    grad_key = (_sum_heads(torch.matmul(grad_scores.transpose(-2, -1), query) * scale, key.shape[-3])
                if grad_input_mask[1] else None)
    grad_value = (_sum_heads(torch.matmul(weights.transpose(-2, -1), grad_out), value.shape[-3])
                  if grad_input_mask[2] else None)
    grad_bias = None
    if grad_input_mask[3] and attn_bias is not None and attn_bias.dtype != torch.bool:
        grad_bias = _sum_to(grad_scores, attn_bias.shape)
    return grad_query, grad_key, grad_value, grad_bias


def _sum_to(t, shape):
    """``t`` summed over the dimensions a tensor of ``shape`` was broadcast along."""
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and t.shape[lead + i] != 1]
    return t.sum(dims, keepdim=True).reshape(shape) if dims else t


# ---- convolution ----------------------------------------------------------------------------------

def _weight_gradient(x, grad, kernel, stride, padding, dilation, groups):
    """dW[o, c, t] = sum_{n, u} dy[n, o, u] x[n, c, u*stride + t*dilation - padding]: a convolution of x
    (channels and batch swapped) by dy, with stride and dilation swapped, one group per group."""
    spatial = x.dim() - 2
    batch, channels = x.shape[:2]
    outputs = grad.shape[1]
    per_in, per_out = channels // groups, outputs // groups
    rest = list(range(3, 3 + spatial))
    inputs = x.reshape(batch, groups, per_in, *x.shape[2:]).permute(2, 1, 0, *rest)
    inputs = inputs.reshape(per_in, groups * batch, *x.shape[2:])
    weights = grad.reshape(batch, groups, per_out, *grad.shape[2:]).permute(1, 2, 0, *rest)
    weights = weights.reshape(groups * per_out, batch, *grad.shape[2:])
    result = aten.convolution(inputs, weights, None, list(dilation), list(padding), list(stride), False,
                              [0] * spatial, groups)
    for d, size in enumerate(kernel):
        result = result.narrow(2 + d, 0, size)
    result = result.reshape(per_in, groups, per_out, *kernel).permute(1, 2, 0, *rest)
    return result.reshape(outputs, per_in, *kernel)


def convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                         groups, output_mask):
    """A convolution's gradients as convolutions. For y = conv(x, W): dx is the transposed
    convolution of dy by W (its output padding chosen to give back x's size), dW is
    :func:`_weight_gradient`. A transposed convolution is the input gradient of conv(., W), so its
    dx is conv(dy, W), and its dW is conv's weight gradient with the roles of x and dy exchanged."""
    spatial = x.dim() - 2
    stride, padding, dilation = (list(v) * (spatial if len(v) == 1 else 1) for v in (stride, padding, dilation))
    kernel = list(weight.shape[2:])
    grad_input = grad_weight = grad_bias = None
    if output_mask[2]:
        grad_bias = grad.sum([0, *range(2, grad.dim())])
    if not transposed:
        if output_mask[0]:
            extra = [x.shape[2 + d] + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1
                     - (grad.shape[2 + d] - 1) * stride[d] for d in range(spatial)]
            grad_input = aten.convolution(grad, weight, None, stride, padding, dilation, True, extra, groups)
        if output_mask[1]:
            grad_weight = _weight_gradient(x, grad, kernel, stride, padding, dilation, groups)
    else:
        if output_mask[0]:
            grad_input = aten.convolution(grad, weight, None, stride, padding, dilation, False, [0] * spatial,
                                          groups)
        if output_mask[1]:
            grad_weight = _weight_gradient(grad, x, kernel, stride, padding, dilation, groups)
    return grad_input, grad_weight, grad_bias


# ---- pooling and padding (stand-ins for the private pipeline) -------------------------------------

def _window_sums(x, kernel, stride, padding, ceil_mode, outputs):
    """Sums over each pooling window of ``x`` (N, C, *spatial) zero-padded: a depthwise convolution
    by ones. ``outputs``: the pooled sizes (the input is padded on the right for ceil_mode's last
    window)."""
    spatial = len(kernel)
    batch, channels = x.shape[:2]
    pads = []
    for d in reversed(range(spatial)):
        needed = (outputs[d] - 1) * stride[d] + kernel[d]
        pads += [padding[d], max(0, needed - x.shape[2 + d] - padding[d])]
    flat = torch.nn.functional.pad(x.reshape(batch * channels, 1, *x.shape[2:]), pads)
    ones = torch.ones(1, 1, *kernel, dtype=x.dtype, device=x.device)
    sums = aten.convolution(flat, ones, None, list(stride), [0] * spatial, [1] * spatial, False, [0] * spatial, 1)
    for d in range(spatial):
        sums = sums.narrow(2 + d, 0, outputs[d])
    return sums.reshape(batch, channels, *outputs)


def _pool_divisors(shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, outputs,
                   dtype, device):
    """Each output's divisor: ``divisor_override``; else its window's size, the part inside the padded
    input (count_include_pad) or inside the input."""
    if divisor_override:
        return torch.full((), float(divisor_override), dtype=dtype, device=device)
    spatial = len(kernel)
    inside = torch.ones(1, 1, *shape, dtype=dtype, device=device)
    if count_include_pad:  # the padded input counts, windows hanging past it do not
        inside = torch.nn.functional.pad(inside, [p for d in reversed(range(spatial)) for p in (padding[d],) * 2],
                                         value=1.0)
        padding = [0] * spatial
    return _window_sums(inside, kernel, stride, padding, ceil_mode, outputs)[0, 0]


def _pool_arguments(spatial, kernel, stride, padding):
    """Kernel, stride and padding with one entry per spatial dimension (a single entry repeats; an
    empty stride is the kernel)."""
    def full(values):
        values = [values] if isinstance(values, int) else list(values)
        return values * spatial if len(values) == 1 else values

    kernel = full(kernel)
    return kernel, (full(stride) if stride else kernel), full(padding)


def _pooled_size(size, kernel, stride, padding, ceil_mode):
    span = size + 2 * padding - kernel
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:  # the last window must start inside
        out -= 1
    return out


def avg_pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None,
             *, spatial):
    """Window sums (:func:`_window_sums`) divided by each window's divisor."""
    kernel, stride, padding = _pool_arguments(spatial, kernel_size, stride, padding)
    unbatched = x.dim() == spatial + 1
    if unbatched:
        x = x.unsqueeze(0)
    shape = list(x.shape[2:])
    outputs = [_pooled_size(shape[d], kernel[d], stride[d], padding[d], ceil_mode) for d in range(len(kernel))]
    sums = _window_sums(x, kernel, stride, padding, ceil_mode, outputs)
    result = sums / _pool_divisors(shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                                   outputs, x.dtype, x.device)
    return result.squeeze(0) if unbatched else result


def avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, *,
                      spatial):
    """Each output's gradient divided by its divisor and spread over its window: the transposed
    window sum, cut back to the input (the padding removed)."""
    kernel, stride, padding = _pool_arguments(spatial, kernel_size, stride, padding)
    unbatched = x.dim() == spatial + 1
    if unbatched:
        x, grad = x.unsqueeze(0), grad.unsqueeze(0)
    shape = list(x.shape[2:])
    outputs = list(grad.shape[2:])
    scaled = grad / _pool_divisors(shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                                   outputs, grad.dtype, grad.device)
    batch, channels = grad.shape[:2]
    ones = torch.ones(1, 1, *kernel, dtype=grad.dtype, device=grad.device)
    spread = aten.convolution(scaled.reshape(batch * channels, 1, *outputs), ones, None, list(stride),
                              [0] * spatial, [1] * spatial, True, [0] * spatial, 1)
    for d in range(spatial):  # the padded input's coordinates: drop the padding, fill what no window reached
        covered = spread.shape[2 + d]
        if covered < padding[d] + shape[d]:
            pads = [0, 0] * (spatial - 1 - d) + [0, padding[d] + shape[d] - covered]
            spread = torch.nn.functional.pad(spread, pads)
        spread = spread.narrow(2 + d, padding[d], shape[d])
    result = spread.reshape(batch, channels, *shape)
    return result.squeeze(0) if unbatched else result


def _adaptive_matrix(size, outputs, dtype, device):
    """(outputs, size): row i averages input positions [floor(i*size/outputs), ceil((i+1)*size/outputs))."""
    row = torch.arange(outputs, device=device).view(-1, 1)
    start = (row * size) // outputs
    end = ((row + 1) * size + outputs - 1) // outputs
    position = torch.arange(size, device=device).view(1, -1)
    member = ((position >= start) & (position < end)).to(dtype)
    return member / (end - start).to(dtype)


def adaptive_avg_pool(x, output_size):
    """Adaptive average pooling is separable: one averaging matrix per spatial dimension."""
    spatial = len(output_size)
    for d in range(spatial):
        dim = x.dim() - spatial + d
        matrix = _adaptive_matrix(x.shape[dim], output_size[d], x.dtype, x.device)
        x = torch.matmul(matrix, x.movedim(dim, -2)).movedim(-2, dim)
    return x


def adaptive_avg_pool_backward(grad, x, *, spatial):
    """The transposes of the averaging matrices, applied to the gradient."""
    for d in range(spatial):
        dim = grad.dim() - spatial + d
        matrix = _adaptive_matrix(x.shape[dim], grad.shape[dim], grad.dtype, grad.device)
        grad = torch.matmul(matrix.t(), grad.movedim(dim, -2)).movedim(-2, dim)
    return grad


def adaptive_max_pool(x, output_size):
    """Adaptive max pooling with its indices: every window gathered at once (each padded to the widest
    window of its dimension, the padding masked with -inf), then max and argmax over it. The index is
    the position in the flattened spatial input, as torch returns it."""
    spatial = len(output_size)
    sizes = list(x.shape[-spatial:])
    lead = x.dim() - spatial
    positions, valid, flat = [], None, None
    for d, (size, outputs) in enumerate(zip(sizes, output_size)):
        width = max(((i + 1) * size + outputs - 1) // outputs - (i * size) // outputs for i in range(outputs))
        row = torch.arange(outputs, device=x.device).view(-1, 1)
        position = (row * size) // outputs + torch.arange(width, device=x.device).view(1, -1)
        inside = position < ((row + 1) * size + outputs - 1) // outputs
        shape = [1] * (2 * spatial)
        shape[2 * d], shape[2 * d + 1] = outputs, width
        position = torch.clamp(position, max=size - 1).view(shape)
        positions.append(position)
        valid = inside.view(shape) if valid is None else valid & inside.view(shape)
        flat = position * math.prod(sizes[d + 1:]) if flat is None else flat + position * math.prod(sizes[d + 1:])
    windows = x[(Ellipsis, *positions)]  # lead..., out0, width0, out1, width1, ...
    windows = torch.where(valid, windows, torch.full((), float("-inf"), dtype=x.dtype, device=x.device))
    order = [*range(lead), *(lead + 2 * d for d in range(spatial)), *(lead + 2 * d + 1 for d in range(spatial))]
    windows = windows.permute(order).flatten(-spatial)
    flat = flat.expand(valid.shape).permute([2 * d for d in range(spatial)] + [2 * d + 1 for d in range(spatial)])
    values, chosen = windows.max(-1)
    indices = flat.flatten(-spatial).expand(*windows.shape[:lead], *flat.shape[:spatial], -1)
    return values, torch.gather(indices, -1, chosen.unsqueeze(-1)).squeeze(-1)


def _scatter_by_indices(grad, x, indices, spatial):
    """Each output's gradient added at the input position its (flattened spatial) index names."""
    lead = x.shape[:x.dim() - spatial]
    flat_grad = grad.reshape(*lead, -1)
    flat_index = indices.reshape(*lead, -1)
    out = torch.zeros(*lead, math.prod(x.shape[x.dim() - spatial:]), dtype=grad.dtype, device=grad.device)
    return out.scatter_add(-1, flat_index, flat_grad).reshape(x.shape)


def max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, *, spatial):
    return _scatter_by_indices(grad, x, indices, spatial)


def adaptive_max_pool_backward(grad, x, indices, *, spatial):
    return _scatter_by_indices(grad, x, indices, spatial)


def replication_pad_backward(grad, x, padding):
    """Replication padding reads input position clamp(j - left, 0, size - 1) at each output j: its
    gradient adds each output's gradient there, one dimension at a time."""
    spatial = len(padding) // 2
    for d in range(spatial):
        dim = grad.dim() - 1 - d
        left, size = padding[2 * d], x.shape[dim]
        source = torch.clamp(torch.arange(grad.shape[dim], device=grad.device) - left, 0, size - 1)
        shape = list(grad.shape)
        shape[dim] = size
        grad = torch.zeros(shape, dtype=grad.dtype, device=grad.device).index_add(dim, source, grad)
    return grad


def pad_circular(x, pad):
    """Circular padding: each dimension (last first) extended by its own ends, wrapped around;
    negative amounts crop."""
    for d in range(len(pad) // 2):
        dim = x.dim() - 1 - d
        left, right = pad[2 * d], pad[2 * d + 1]
        x = x.narrow(dim, max(0, -left), x.shape[dim] - max(0, -left) - max(0, -right))  # crop first
        size = x.shape[dim]
        parts = [x.narrow(dim, size - left, left)] if left > 0 else []
        parts.append(x)
        if right > 0:
            parts.append(x.narrow(dim, 0, right))
        x = torch.cat(parts, dim) if len(parts) > 1 else parts[0]
    return x


# ---- reductions by index --------------------------------------------------------------------------

def _reduction_identity(reduce: str, dtype):
    """The value a reduction starts from: what an empty group reduces to before ``include_self``."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.is_floating_point:
        return -math.inf if reduce == "amax" else math.inf
    return torch.iinfo(dtype).min if reduce == "amax" else torch.iinfo(dtype).max


def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    """``x`` with each ``src`` element reduced into the position ``index`` names along ``dim``: every
    (source, target) pair compared at once, a one-hot of shape (..., n sources, m targets) reduced over
    the sources. Integer means (which round) are left to the op."""
    if reduce == "mean" and not x.dtype.is_floating_point:
        return NotImplemented
    if x.dim() == 0:
        return scatter_reduce(x.reshape(1), 0, index.reshape(1), src.reshape(1), reduce,
                              include_self=include_self).reshape(())
    dim = dim % x.dim()
    block = [slice(0, size) for size in index.shape]  # only the part of x that index's extents cover
    target = x[tuple(block[:dim]) + (slice(None),) + tuple(block[dim + 1:])].movedim(dim, -1)
    sources = src[tuple(block)].movedim(dim, -1).to(x.dtype)
    hits = index.movedim(dim, -1).unsqueeze(-1) == torch.arange(x.shape[dim], device=x.device)
    count = hits.sum(-2)
    identity = _reduction_identity(reduce, x.dtype)
    spread = torch.where(hits, sources.unsqueeze(-1), torch.full((), identity, dtype=x.dtype, device=x.device))
    if reduce in ("sum", "mean"):
        reduced = spread.sum(-2, dtype=x.dtype)
    elif reduce == "prod":
        reduced = spread.prod(-2, dtype=x.dtype)
    else:
        reduced = spread.amax(-2) if reduce == "amax" else spread.amin(-2)
    if include_self:
        if reduce == "mean":
            reduced = (reduced + target) / (count + 1)
        elif reduce == "sum":
            reduced = reduced + target
        elif reduce == "prod":
            reduced = reduced * target
        else:
            reduced = torch.maximum(reduced, target) if reduce == "amax" else torch.minimum(reduced, target)
    elif reduce == "mean":
        reduced = reduced / count.clamp(min=1)
    return _into(x, torch.where(count > 0, reduced, target).movedim(-1, dim))


def _into(x, block):
    """``x`` with ``block`` written over its leading corner, one dimension at a time (slice_scatter)."""
    for d in range(x.dim()):
        if block.shape[d] != x.shape[d]:
            around = x[tuple(slice(None) if e == d else slice(0, block.shape[e]) for e in range(x.dim()))]
            block = around.slice_scatter(block, d, 0, block.shape[d])
    return block


def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    """Along ``dim``, source slice i reduced into x's slice index[i]: a scatter_reduce whose index is
    ``index`` spread over every other dimension."""
    if x.dim() == 0:
        return index_reduce(x.reshape(1), 0, index, source.reshape(1), reduce, include_self=include_self).reshape(())
    dim = dim % x.dim()
    shape = [1] * source.dim()
    shape[dim] = -1
    return scatter_reduce(x, dim, index.reshape(shape).expand(source.shape), source, reduce,
                          include_self=include_self)


def put(x, index, source, accumulate=False):
    """``x.flatten()[index] = source`` (or ``+=``), negative indices counted from the end."""
    flat = x.reshape(-1)
    index = index.reshape(-1)
    index = torch.where(index < 0, index + flat.numel(), index)
    source = source.reshape(-1).to(x.dtype)
    flat = flat.scatter_add(0, index, source) if accumulate else flat.scatter(0, index, source)
    return flat.view(x.shape)


def masked_scatter_backward(grad, mask, sizes):
    """The source's gradient: masked_scatter took source element k for the k-th true position of the
    mask, so each true position's gradient goes back to its rank; the source elements it did not use
    get none."""
    flat_mask = mask.expand(grad.shape).reshape(-1)
    total = math.prod(sizes)
    rank = torch.cumsum(flat_mask.to(torch.int64), 0) - 1
    target = torch.where(flat_mask & (rank < total), rank, total)
    out = grad.new_zeros(total + 1).scatter_add(0, target, torch.where(flat_mask, grad.reshape(-1), 0))
    return out[:total].view(sizes)


def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    """For each value, how many elements of its (innermost) sorted row are below it (or at most it,
    with ``right``): every comparison at once."""
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    right = right or side == "right"
    values = values if isinstance(values, torch.Tensor) else torch.full((), values, device=sorted_sequence.device)
    if sorted_sequence.dim() == 1:
        row = sorted_sequence.view([1] * values.dim() + [-1])
    else:
        row = sorted_sequence.unsqueeze(-2)
    below = row <= values.unsqueeze(-1) if right else row < values.unsqueeze(-1)
    return below.sum(-1).to(torch.int32 if out_int32 else torch.int64)


def prims_prod(x, dims, *, output_dtype=None):
    """torch's cumprod decomposition leaves the primitive ``prims.prod``, which torch-mlir does not
    know: aten's product, one dimension at a time."""
    for dim in sorted((d % x.dim() for d in (dims if dims is not None else range(x.dim()))), reverse=True):
        x = torch.prod(x, dim)
    return x.to(output_dtype) if output_dtype is not None else x


def reduction_of_a_scalar(x, *args, dtype=None, **kwargs):
    """A reduction (sum, amax, amin) of a 0-d tensor is the tensor itself: torch-mlir crashes on
    reducing no dimensions."""
    if x.dim() != 0:
        return NotImplemented
    return x.to(dtype) if dtype is not None else x.clone()


def scatter_of_a_scalar(x, dim, index, src):
    """A scatter into a 0-d tensor (what the backward of a value-selecting reduction of one, such as
    mode's or kthvalue's, makes) is its source's first element, or the tensor when the index is
    empty: torch-mlir does not lower the scatter."""
    if x.dim() != 0:
        return NotImplemented
    if index.numel() == 0:
        return x.clone()
    return src.reshape(-1)[0].to(x.dtype)


def arg_of_a_scalar(x, *args, **kwargs):
    """argmax/argmin of a 0-d tensor: position 0."""
    if x.dim() != 0:
        return NotImplemented
    return torch.zeros((), dtype=torch.int64, device=x.device)


def _segments(data, lengths, offsets, axis):
    """``data`` as (batch, length, rest) around ``axis``, and which positions each segment holds:
    (batch, segments, length), from the lengths (each segment starts where the one before ends)
    or from the offsets (segment s is offsets[s] up to offsets[s + 1])."""
    axis = axis % data.dim()
    batch, rest = data.shape[:axis], data.shape[axis + 1:]
    flat = data.reshape(math.prod(batch), data.shape[axis], math.prod(rest))
    if offsets is not None:
        bounds = offsets.reshape(flat.shape[0], -1)
        starts, ends = bounds[:, :-1], bounds[:, 1:]
    else:
        ends = torch.cumsum(lengths.reshape(flat.shape[0], -1), -1)
        starts = ends - lengths.reshape(flat.shape[0], -1)
    position = torch.arange(flat.shape[1], device=data.device)
    member = (starts.unsqueeze(-1) <= position) & (position < ends.unsqueeze(-1))
    return flat, member, (*batch, starts.shape[-1], *rest)


_SEGMENT_REDUCTIONS = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "amax", "min": "amin"}


def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Each segment of ``data`` along ``axis`` reduced, ``initial`` taken in (a mean divides the sum
    with it by the segment's length); an empty segment is ``initial``, else the reduction's identity
    (a mean's is NaN, 0 / 0): every (segment, position) pair at once."""
    if indices is not None or (lengths is None and offsets is None) or not data.dtype.is_floating_point:
        return NotImplemented
    flat, member, shape = _segments(data, lengths, offsets, axis)
    kind = _SEGMENT_REDUCTIONS[reduce]
    identity = torch.full((), _reduction_identity(kind, data.dtype), dtype=data.dtype, device=data.device)
    spread = torch.where(member.unsqueeze(-1), flat.unsqueeze(1), identity)  # (batch, segments, length, rest)
    if kind == "sum":
        out = spread.sum(2)
    elif kind == "prod":
        out = spread.prod(2)
    else:
        out = spread.amax(2) if kind == "amax" else spread.amin(2)
    if initial is not None:
        start = torch.full((), initial, dtype=data.dtype, device=data.device)
        out = {"sum": out + start, "prod": out * start, "amax": torch.maximum(out, start),
               "amin": torch.minimum(out, start)}[kind]
    if reduce == "mean":
        count = member.sum(-1, keepdim=True).to(data.dtype)
        out = out / count if initial is None else torch.where(count > 0, out / count, out)
    return out.reshape(shape)


def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """The data's gradient: each position's segment's gradient, divided by the segment's length for
    a mean; for max and min given to the positions equal to the result (NaN equal to NaN), and, as
    CPU's kernel does, a positive one divided among them when there are several (a negative one is
    not); for a product times result / value, or where the value is 0 or NaN times the product of
    the segment's other positions and ``initial``. Positions in no segment get none."""
    flat, member, _ = _segments(data, lengths, offsets, axis)
    segments = member.shape[1]
    grad = grad.reshape(flat.shape[0], segments, flat.shape[2])
    output = output.reshape(flat.shape[0], segments, flat.shape[2])
    inside = member.unsqueeze(-1)  # (batch, segments, length, 1)
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)

    def each(t):  # (batch, segments, rest) -> (batch, length, rest): each position's segment's value
        return torch.where(inside, t.unsqueeze(2), zero).sum(1)

    if reduce == "sum":
        result = each(grad)
    elif reduce == "mean":
        count = member.sum(-1, keepdim=True).to(grad.dtype).clamp(min=1)
        result = each(grad / count)
    elif reduce in ("max", "min"):
        chosen = (flat.unsqueeze(1) == output.unsqueeze(2)) | (torch.isnan(flat.unsqueeze(1))
                                                               & torch.isnan(output.unsqueeze(2)))
        chosen = chosen & inside
        ties = chosen.sum(2).to(grad.dtype)
        shared = torch.where((ties > 1) & (grad > 0), grad / ties.clamp(min=1), grad)
        result = torch.where(chosen, shared.unsqueeze(2), zero).sum(1)
    else:  # prod
        segment = torch.where(member, torch.arange(segments, device=data.device).unsqueeze(-1), -1).amax(1)
        position = torch.arange(flat.shape[1], device=data.device)
        others = (segment.unsqueeze(-1) == segment.unsqueeze(-2)) & (position.unsqueeze(-1) != position)
        one = torch.ones((), dtype=data.dtype, device=data.device)
        rest = torch.where(others.unsqueeze(-1), flat.unsqueeze(1), one).prod(2)  # (batch, length, rest)
        if initial is not None:
            rest = rest * initial
        plain = (flat == 0) | torch.isnan(flat)
        result = torch.where(plain, each(grad) * rest, each(grad * output) / flat)
    return result.reshape(data.shape)


# ---- order statistics ------------------------------------------------------------------------------

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


# ---- distances and elementwise ---------------------------------------------------------------------

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
    masked = torch.where(before, pairs, _reduction_identity("amax" if largest else "amin", x.dtype))
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


# ---- anti-aliased resizing -------------------------------------------------------------------------

def _antialias_matrix(size, outputs, scale_factor, dtype, device):
    """(outputs, size): output i is a normalized triangle-filter average of the inputs around its
    centre, the filter widened by the scale when shrinking (so every input contributes)."""
    scale = 1.0 / scale_factor if scale_factor else size / outputs
    support = scale if scale >= 1.0 else 1.0
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    centre = (torch.arange(outputs, device=device, dtype=dtype) + 0.5).unsqueeze(1) * scale
    first = torch.floor(centre - support + 0.5).clamp(min=0)
    last = torch.floor(centre + support + 0.5).clamp(max=size)
    position = torch.arange(size, device=device, dtype=dtype)
    weights = torch.clamp(1.0 - ((position - centre + 0.5) * inverse).abs(), min=0.0)
    weights = torch.where((position >= first) & (position < last), weights, 0.0)
    total = weights.sum(1, keepdim=True)
    return torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), 0.0)


def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    """Anti-aliased bilinear resizing is separable: one filter matrix per spatial dimension."""
    if align_corners:
        return NotImplemented
    rows = _antialias_matrix(x.shape[-2], output_size[0], scales_h, x.dtype, x.device)
    columns = _antialias_matrix(x.shape[-1], output_size[1], scales_w, x.dtype, x.device)
    return rows @ x @ columns.T


def upsample_bilinear2d_aa_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    """The filter matrices' transposes applied to the gradient."""
    if align_corners:
        return NotImplemented
    rows = _antialias_matrix(input_size[-2], output_size[0], scales_h, grad.dtype, grad.device)
    columns = _antialias_matrix(input_size[-1], output_size[1], scales_w, grad.dtype, grad.device)
    return rows.T @ grad @ columns


def frexp(x):
    """x = mantissa * 2^exponent with |mantissa| in [0.5, 1): the exponent from log2 of the magnitude,
    corrected by one where rounding put the mantissa just outside; zero, infinities and NaN keep a
    zero exponent and themselves as mantissa."""
    finite = torch.isfinite(x) & (x != 0)
    magnitude = torch.where(finite, x.abs(), torch.ones_like(x))
    exponent = torch.floor(torch.log2(magnitude)) + 1
    mantissa = magnitude * torch.pow(2.0, -exponent)
    exponent = torch.where(mantissa >= 1, exponent + 1, torch.where(mantissa < 0.5, exponent - 1, exponent))
    mantissa = magnitude * torch.pow(2.0, -exponent)
    mantissa = torch.where(finite, torch.copysign(mantissa, x), x)
    return mantissa, torch.where(finite, exponent, torch.zeros_like(exponent)).to(torch.int32)


# ---- grid sampling ---------------------------------------------------------------------------------

def _reflect(x, twice_low, twice_high):
    """``x`` reflected into [low, high] (a triangle wave of period 2 (high - low)), and its slope (+-1).
    The remainder is taken by the floor of the quotient (torch-mlir does not lower fmod)."""
    if twice_low == twice_high:
        return torch.zeros_like(x), torch.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    shifted = x - low
    sign = torch.where(shifted < 0, -1.0, 1.0).to(x.dtype)
    shifted = shifted.abs()
    flips = torch.floor(shifted / span)
    extra = shifted - flips * span
    even = torch.floor(flips / 2) * 2 == flips
    return torch.where(even, extra + low, span - extra + low), torch.where(even, sign, -sign)


def _clip(x, size):
    """``x`` clamped to [0, size - 1], and its slope (0 at and beyond the ends)."""
    inside = (x > 0) & (x < size - 1)
    return x.clamp(0, size - 1), inside.to(x.dtype)


def _unnormalize(coordinate, size, align_corners):
    """A grid coordinate in [-1, 1] as a position in pixels, and its slope: the corners' centres are
    -1 and 1 with ``align_corners``, else the corners' edges."""
    if align_corners:
        return (coordinate + 1) / 2 * (size - 1), (size - 1) / 2
    return ((coordinate + 1) * size - 1) / 2, size / 2


def _grid_source(coordinate, size, padding_mode, align_corners):
    """The position a grid coordinate samples (padding mode 1: clamped to the border, 2: reflected
    about it, then clamped), and its slope with respect to the coordinate."""
    x, slope = _unnormalize(coordinate, size, align_corners)
    slope = torch.full_like(x, slope)
    if padding_mode == 2:
        x, sign = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        slope = slope * sign
    if padding_mode in (1, 2):
        x, inside = _clip(x, size)
        slope = slope * inside
    return x, slope


def _cubic(t):
    """The four cubic convolution coefficients (A = -0.75) of taps -1, 0, 1, 2 at fraction ``t``,
    and their derivatives in ``t``."""
    a = -0.75
    near = lambda s: ((a + 2) * s - (a + 3)) * s * s + 1  # noqa: E731 - |s| <= 1
    far = lambda s: ((a * s - 5 * a) * s + 8 * a) * s - 4 * a  # noqa: E731 - 1 < |s| < 2
    d_near = lambda s: (3 * (a + 2) * s - 2 * (a + 3)) * s  # noqa: E731
    d_far = lambda s: (3 * a * s - 10 * a) * s + 8 * a  # noqa: E731
    values = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    slopes = [d_far(t + 1), d_near(t), -d_near(1 - t), -d_far(2 - t)]
    return values, slopes


def _grid_taps(x_shape, grid, interpolation_mode, padding_mode, align_corners):
    """The taps a grid sample reads: for each, its position in each spatial dimension (input
    order), whether it is inside, its weight, and the weight's derivative with respect to each grid
    coordinate (grid order: x is the last spatial dimension)."""
    spatial = x_shape[2:]
    count = len(spatial)
    coordinates = [grid[..., count - 1 - d] for d in range(count)]  # input order
    taps = []
    if interpolation_mode == 2:  # bicubic: taps -1..2 around the position, each tap index padded
        sources = [_unnormalize(c, size, align_corners) for c, size in zip(coordinates, spatial)]
        floors = [torch.floor(x) for x, _ in sources]
        cubics = [_cubic(x - f) for (x, _), f in zip(sources, floors)]
        for offsets in itertools.product(range(4), repeat=count):
            positions, inside, weight = [], None, 1.0
            for d, o in enumerate(offsets):
                position = floors[d] + (o - 1)
                if padding_mode == 2:
                    position = (_reflect(position, 0, 2 * (spatial[d] - 1)) if align_corners
                                else _reflect(position, -1, 2 * spatial[d] - 1))[0]
                if padding_mode in (1, 2):
                    position = position.clamp(0, spatial[d] - 1)
                within = (position >= 0) & (position <= spatial[d] - 1)
                inside = within if inside is None else inside & within
                positions.append(position)
                weight = weight * cubics[d][0][o]
            slopes = []
            for d in range(count):
                slope = cubics[d][1][offsets[d]] * sources[d][1]
                for e in range(count):
                    if e != d:
                        slope = slope * cubics[e][0][offsets[e]]
                slopes.append(slope)
            taps.append((positions, inside, weight, slopes))
        return taps
    sources = [_grid_source(c, size, padding_mode, align_corners) for c, size in zip(coordinates, spatial)]
    if interpolation_mode == 1:  # nearest (half to even, as nearbyint), no gradient to the grid
        positions = [torch.round(x) for x, _ in sources]
        inside = functools.reduce(operator.and_, [(p >= 0) & (p <= size - 1) for p, size in zip(positions, spatial)])
        return [(positions, inside, torch.ones_like(positions[0]), [torch.zeros_like(positions[0])] * count)]
    floors = [torch.floor(x) for x, _ in sources]
    fractions = [x - f for (x, _), f in zip(sources, floors)]
    for corner in itertools.product((0, 1), repeat=count):
        positions = [f + c for f, c in zip(floors, corner)]
        inside = functools.reduce(operator.and_, [(p >= 0) & (p <= size - 1) for p, size in zip(positions, spatial)])
        factors = [t if c else 1 - t for t, c in zip(fractions, corner)]
        weight = functools.reduce(operator.mul, factors)
        slopes = []
        for d in range(count):
            slope = (1.0 if corner[d] else -1.0) * sources[d][1]
            for e in range(count):
                if e != d:
                    slope = slope * factors[e]
            slopes.append(slope)
        taps.append((positions, inside, weight, slopes))
    return taps


def _tap_index(positions, inside, spatial):
    """The flat index (N, P) of each tap in the input's flattened spatial dimensions (0 outside)."""
    index = torch.zeros_like(positions[0], dtype=torch.int64)
    for position, size in zip(positions, spatial):
        index = index * size + position.clamp(0, size - 1).to(torch.int64)
    return torch.where(inside, index, 0).reshape(index.shape[0], -1)


def _grid_values(flat, index, channels):
    """``flat`` (N, C, H*W...) at each tap's index: (N, C, P)."""
    return flat.gather(2, index.unsqueeze(1).expand(-1, channels, -1))


def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    """Each grid point's sample: the taps' values (zero outside) weighted and summed."""
    if interpolation_mode == 2 and x.dim() != 4:
        return NotImplemented
    batch, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    flat = x.reshape(batch, channels, -1)
    out = torch.zeros(batch, channels, math.prod(grid.shape[1:-1]), dtype=x.dtype, device=x.device)
    for positions, inside, weight, _ in _grid_taps(x.shape, grid, interpolation_mode, padding_mode, align_corners):
        index = _tap_index(positions, inside, spatial)
        scale = torch.where(inside, weight, 0).reshape(batch, 1, -1)
        out = out + _grid_values(flat, index, channels) * scale
    return out.reshape(batch, channels, *grid.shape[1:-1])


def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """The input's gradient: each tap's weighted output gradient added at its position (none from
    outside); the grid's: for each coordinate, the taps' values times their weights' derivatives,
    summed over channels (zero for nearest), always given, as by CPU's kernel."""
    if interpolation_mode == 2 and x.dim() != 4:
        return NotImplemented
    batch, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    count = len(spatial)
    flat = x.reshape(batch, channels, -1)
    grad = grad.reshape(batch, channels, -1)
    grad_input = torch.zeros_like(flat)
    grad_grid = [torch.zeros(batch, grad.shape[2], dtype=grid.dtype, device=grid.device) for _ in range(count)]
    for positions, inside, weight, slopes in _grid_taps(x.shape, grid, interpolation_mode, padding_mode, align_corners):
        index = _tap_index(positions, inside, spatial)
        mask = inside.reshape(batch, 1, -1)
        if output_mask[0]:
            spread = torch.where(mask, grad * weight.reshape(batch, 1, -1), 0)
            grad_input = grad_input.scatter_add(2, index.unsqueeze(1).expand(-1, channels, -1), spread)
        if interpolation_mode != 1:
            along = torch.where(mask, _grid_values(flat, index, channels) * grad, 0).sum(1)  # (N, P)
            for d in range(count):
                grad_grid[d] = grad_grid[d] + along * slopes[d].reshape(batch, -1)
    grad_input = grad_input.view(x.shape) if output_mask[0] else None
    return grad_input, torch.stack([grad_grid[count - 1 - i] for i in range(count)], -1).view(grid.shape)
