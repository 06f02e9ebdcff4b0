"""Convolution backward, pooling and padding: the stand-ins for TorchNeuron's private pipeline.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


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
