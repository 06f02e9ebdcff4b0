"""Resampling: anti-aliased bilinear resizing and grid sampling, forward and backward.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import functools
import itertools
import math
import operator

import torch


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
    if interpolation_mode == 2:
        return _bicubic_taps(coordinates, spatial, padding_mode, align_corners)
    sources = [_grid_source(c, size, padding_mode, align_corners) for c, size in zip(coordinates, spatial)]
    if interpolation_mode == 1:  # nearest (half to even, as nearbyint), no gradient to the grid
        positions = [torch.round(x) for x, _ in sources]
        inside = functools.reduce(operator.and_, [(p >= 0) & (p <= size - 1) for p, size in zip(positions, spatial)])
        return [(positions, inside, torch.ones_like(positions[0]), [torch.zeros_like(positions[0])] * count)]
    return _linear_taps(sources, spatial)


def _slopes(first: list, others: list) -> list:
    """Each dimension's derivative: its own factor's (``first[d]``) times the other dimensions' factors."""
    slopes = []
    for d in range(len(first)):
        slope = first[d]
        for e in range(len(first)):
            if e != d:
                slope = slope * others[e]
        slopes.append(slope)
    return slopes


def _bicubic_taps(coordinates, spatial, padding_mode, align_corners):
    """Bicubic: taps -1..2 around the position in each dimension, each tap index padded."""
    count = len(spatial)
    sources = [_unnormalize(c, size, align_corners) for c, size in zip(coordinates, spatial)]
    floors = [torch.floor(x) for x, _ in sources]
    cubics = [_cubic(x - f) for (x, _), f in zip(sources, floors)]
    taps = []
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
        slopes = _slopes([cubics[d][1][offsets[d]] * sources[d][1] for d in range(count)],
                         [cubics[e][0][offsets[e]] for e in range(count)])
        taps.append((positions, inside, weight, slopes))
    return taps


def _linear_taps(sources, spatial):
    """Bilinear (trilinear): the 2**n corners around the position."""
    count = len(spatial)
    floors = [torch.floor(x) for x, _ in sources]
    fractions = [x - f for (x, _), f in zip(sources, floors)]
    taps = []
    for corner in itertools.product((0, 1), repeat=count):
        positions = [f + c for f, c in zip(floors, corner)]
        inside = functools.reduce(operator.and_, [(p >= 0) & (p <= size - 1) for p, size in zip(positions, spatial)])
        factors = [t if c else 1 - t for t, c in zip(fractions, corner)]
        weight = functools.reduce(operator.mul, factors)
        slopes = _slopes([(1.0 if corner[d] else -1.0) * sources[d][1] for d in range(count)], factors)
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
