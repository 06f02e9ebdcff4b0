"""What the special functions share: polynomial evaluation, dtype promotion, sin and cot of pi x.

The special functions (:mod:`.special_gamma`, :mod:`.special_normal`, :mod:`.special_bessel`) are
elementary torch ops, as torch-mlir lowers none of these ATen ops. Each is written from the
mathematics, with the series, recurrence, asymptotic expansion or published approximation named in
its docstring; all use fixed iteration counts (no data-dependent control flow) and compute in the
input's floating dtype, matching torch's special values."""
from __future__ import annotations

import math

import torch


INF = math.inf
NAN = math.nan
LOG_2PI_HALF = 0.5 * math.log(2 * math.pi)
EULER = 0.57721566490153286061


def poly(coeffs, x):
    """Horner evaluation, coefficients from the highest power down."""
    result = torch.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        result = result * x + c
    return result


def float_dtype(*args):
    dtype = torch.result_type(*args) if len(args) > 1 else args[0].dtype
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def as_float(*args):
    """The arguments as tensors of their promoted floating dtype (torch promotes integers to the
    default dtype for these ops), on the device of the first tensor."""
    dtype = float_dtype(*args)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    return [a.to(dtype) if isinstance(a, torch.Tensor) else torch.full((), a, dtype=dtype, device=device)
            for a in args]


def promotes(function):
    """``function`` called with its arguments as tensors of their promoted floating dtype."""
    def promoted(*args):
        return function(*as_float(*args))

    promoted.__name__, promoted.__doc__ = function.__name__, function.__doc__
    return promoted


def is_int(x):
    return x == torch.floor(x)


def cot_pi(x):
    """cot(pi x) with the argument reduced to r in [-1/2, 1/2] and cos(pi r) written as
    sin(pi (1/2 - |r|)), so it is accurate near the integers and the half-integers."""
    r = x - torch.round(x)
    return torch.sign(r) * torch.sin(math.pi * (0.5 - r.abs())) / torch.sin(math.pi * r.abs())


def abs_sin_pi(x):
    """|sin(pi x)| with the argument reduced first, so it is accurate near the integers."""
    return torch.sin(math.pi * (x - torch.round(x))).abs()
