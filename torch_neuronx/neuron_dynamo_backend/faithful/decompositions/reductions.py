"""Reductions by index: scatter_reduce, index_reduce, put, searchsorted, segment reductions, and
reductions of a scalar.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import math

import torch


def reduction_identity(reduce: str, dtype):
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
    identity = reduction_identity(reduce, x.dtype)
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
    identity = torch.full((), reduction_identity(kind, data.dtype), dtype=data.dtype, device=data.device)
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
