"""Views, indexing and embeddings: as_strided by the positions it reads, index_put, index_copy, nonzero_static,
embedding bags and their backwards.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


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
    out, chosen_rows = _bag_maximum(rows, indices, member, size, zero, weight)
    return out, offset2bag, size, chosen_rows


def _bag_maximum(rows, indices, member, size, zero, weight):
    """(each bag's maximum per column, the row chosen per column), as embedding_bag's mode 2 gives them."""
    inside = member.unsqueeze(-1)
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
    return out, torch.where(empty, 0, chosen_rows)


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
