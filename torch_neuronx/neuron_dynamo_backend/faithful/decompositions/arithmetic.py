"""Arithmetic: scalar_tensor, vector norms, activation backwards, shifts, foreach pow, linear_backward,
grouped matmul.

Written from each operator's mathematics into ops that lower to StableHLO (see the package's
__init__ for the table that applies them)."""
from __future__ import annotations

import math

import torch


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
