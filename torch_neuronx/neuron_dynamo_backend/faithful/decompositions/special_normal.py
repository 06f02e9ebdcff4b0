"""Error functions and the normal distribution (erfc, erfcx, erfinv, ndtri, log_ndtr), and nextafter. As elementary ops, by the
rules of :mod:`.special_common`."""
from __future__ import annotations

import math

import torch

from torch_neuronx.neuron_dynamo_backend.faithful.decompositions.special_common import INF, NAN, poly, promotes


def _erfcx_positive(x):
    """exp(x^2) erfc(x) for x >= 0: exp(x^2) (1 - erf(x)) below 1.5, Laplace's continued fraction
    erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))) above,
    evaluated backwards from a fixed depth."""
    small = x < 1.5
    xs = torch.where(small, 1.5, x)
    t = xs
    for k in range(40, 0, -1):
        t = xs + (k / 2) / t
    fraction = 1 / (math.sqrt(math.pi) * t)
    xe = torch.where(small, x, 0.0)
    return torch.where(small, torch.exp(xe * xe) * (1 - torch.erf(xe)), fraction)


@promotes
def special_erfcx(x):
    """Scaled complementary error function exp(x^2) erfc(x); erfcx(-x) = 2 exp(x^2) - erfcx(x)."""
    ax = x.abs()
    positive = _erfcx_positive(ax)
    return torch.where(x < 0, 2 * torch.exp(x * x) - positive, positive)


def erfc_positive(x):
    """erfc(x) for x >= 0, accurate relative to its value in the tail."""
    return torch.where(x < 0.5, 1 - torch.erf(x), torch.exp(-x * x) * _erfcx_positive(x))


@promotes
def erfc(x):
    """Complementary error function: 1 - erf(x) near 0, exp(-x^2) erfcx(x) in the tail,
    erfc(-x) = 2 - erfc(x)."""
    positive = erfc_positive(x.abs())
    return torch.where(x < 0, 2 - positive, positive)


@promotes
def special_log_ndtr(x):
    """log Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2: log1p(-erfc(x / sqrt 2) / 2) for x >= 0, and
    log(erfcx(-x / sqrt 2) / 2) - x^2 / 2 for x < 0, which stays accurate far into the left tail."""
    t = x / math.sqrt(2)
    right = torch.log1p(-0.5 * erfc_positive(torch.where(x < 0, 0.0, t)))
    tl = torch.where(x < 0, -t, 0.0)
    left = torch.log(0.5 * _erfcx_positive(tl)) - tl * tl
    return torch.where(x < 0, left, right)


# Acklam's rational approximation of the normal quantile: central region, then lower tail.
_ACKLAM_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
             1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_ACKLAM_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
             6.680131188771972e+01, -1.328068155288572e+01, 1.0)
_ACKLAM_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_ACKLAM_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
             3.754408661907416e+00, 1.0)


def _normal_quantile(centred, tail):
    """Phi^-1(p) from p - 1/2 (``centred``, accurate near the middle) and min(p, 1 - p) (``tail``,
    accurate in the tails): Acklam's approximation, refined by one Halley step."""
    r = centred * centred
    central = centred * poly(_ACKLAM_A, r) / poly(_ACKLAM_B, r)
    in_tail = tail < 0.02425
    q = torch.sqrt(-2 * torch.log(torch.where(in_tail, tail, 0.5)))
    lower = poly(_ACKLAM_C, q) / poly(_ACKLAM_D, q)  # the quantile of ``tail``, negative
    x = torch.where(in_tail, torch.where(centred > 0, -lower, lower), central)
    # Halley's step on Phi(|x|) - (1/2 + |centred|), the residual taken from erf in the middle and
    # from erfc in the tails
    ax = torch.where(torch.isfinite(x), x.abs(), 0.0)
    residual = torch.where(in_tail, tail - 0.5 * erfc_positive(ax / math.sqrt(2)),
                           0.5 * torch.erf(ax / math.sqrt(2)) - centred.abs())
    u = residual * math.sqrt(2 * math.pi) * torch.exp(ax * ax / 2)
    ax = torch.where(torch.isfinite(u), ax - u / (1 + ax * u / 2), ax)
    return torch.where(torch.isfinite(x), torch.where(centred > 0, ax, -ax), x)


@promotes
def special_ndtri(p):
    """Inverse of the standard normal CDF (see _normal_quantile); -inf at 0, inf at 1, nan outside."""
    x = _normal_quantile(p - 0.5, torch.where(p < 0.5, p, 1 - p))
    x = torch.where(p == 0, -INF, torch.where(p == 1, INF, x))
    return torch.where((p < 0) | (p > 1), NAN, x)


@promotes
def erfinv(y):
    """Inverse error function, erfinv(y) = Phi^-1((1 + y) / 2) / sqrt 2 with both halves of
    _normal_quantile taken from y exactly."""
    x = _normal_quantile(y / 2, (1 - y.abs()) / 2) / math.sqrt(2)
    x = torch.where(y.abs() == 1, y * INF, x)
    return torch.where(y.abs() > 1, NAN, x)


def nextafter(x, other):
    """The next representable value after x towards other, by stepping x's bit pattern as an
    integer: away from zero when moving away from zero, towards it otherwise."""
    int_type = {torch.float32: torch.int32, torch.float64: torch.int64}[x.dtype]
    x, other = torch.broadcast_tensors(x, other.to(x.dtype))
    bits = x.contiguous().view(int_type)
    # +1 away from zero, -1 towards it (sign arithmetic: the lowering rejects == on booleans)
    step = (torch.sign(other - x) * torch.sign(x)).to(int_type)
    stepped = (bits + step).view(x.dtype)
    tiny = torch.full_like(x, torch.finfo(x.dtype).tiny * torch.finfo(x.dtype).eps)
    stepped = torch.where(x == 0, torch.where(other > 0, tiny, -tiny), stepped)
    stepped = torch.where(x == other, other, stepped)
    return torch.where(torch.isnan(x) | torch.isnan(other), x + other, stepped)
