"""The gamma family (lgamma, digamma, polygamma, Hurwitz zeta) and the incomplete gamma functions. As elementary ops, by the
rules of :mod:`.special_common`."""
from __future__ import annotations

import math

import torch

from torch_neuronx.neuron_dynamo_backend.faithful.decompositions.special_common import (
    INF, LOG_2PI_HALF, NAN, abs_sin_pi, as_float, cot_pi, is_int, poly, promotes)
from torch_neuronx.neuron_dynamo_backend.faithful.decompositions.special_normal import erfc_positive


def _lgamma_positive(z):
    """log Gamma(z) for z > 0: Stirling's series at z + 8, shifted back with the recurrence
    Gamma(z + 8) = z (z + 1) ... (z + 7) Gamma(z)."""
    small = z < 8
    zs = torch.where(small, z + 8, z)
    product = z
    for k in range(1, 8):
        product = product * (z + k)
    shift = torch.where(small, torch.log(torch.where(small, product, 1.0)), 0.0)
    r = 1 / zs
    r2 = r * r
    series = r * (1 / 12 - r2 * (1 / 360 - r2 * (1 / 1260 - r2 * (1 / 1680 - r2 / 1188))))
    return (zs - 0.5) * torch.log(zs) - zs + LOG_2PI_HALF + series - shift


@promotes
def lgamma(x):
    """log|Gamma(x)|: Stirling's series, with the reflection formula
    log|Gamma(x)| = log(pi / |sin(pi x)|) - log Gamma(1 - x) for x < 0."""
    neg = x < 0
    z = torch.where(neg, 1 - x, x)
    positive = _lgamma_positive(torch.where(torch.isinf(z), 1.0, z))
    reflected = math.log(math.pi) - torch.log(abs_sin_pi(torch.where(neg, x, 0.5))) - positive
    return torch.where(torch.isinf(x) | neg & is_int(x), INF, torch.where(neg, reflected, positive))


def _digamma_positive(z):
    """psi(z) for z > 0: the asymptotic series at z + 6, shifted back with
    psi(z) = psi(z + 1) - 1 / z."""
    small = z < 6
    zs = torch.where(small, z + 6, z)
    shift = 0
    for k in range(6):
        shift = shift + 1 / (z + k)
    r2 = 1 / (zs * zs)
    series = r2 * (1 / 12 - r2 * (1 / 120 - r2 * (1 / 252 - r2 * (1 / 240 - r2 / 132))))
    return torch.log(zs) - 0.5 / zs - series - torch.where(small, shift, 0.0)


@promotes
def digamma(x):
    """psi(x): the asymptotic series, with psi(x) = psi(1 - x) - pi cot(pi x) for x < 0. torch
    returns nan at the negative integers and -inf at +0, +inf at -0."""
    neg = x < 0
    positive = _digamma_positive(torch.where(neg, 1 - x, x))
    reflected = positive - math.pi * cot_pi(x)
    result = torch.where(neg, torch.where(is_int(x), NAN, reflected), positive)
    return torch.where(x == 0, -1 / x, result)  # -1/x: copysign(inf, -x) at zero


def _trigamma(x):
    """psi'(x): six steps of the recurrence psi'(z) = psi'(z + 1) + 1 / z^2, the asymptotic series,
    and psi'(1 - x) + psi'(x) = pi^2 / sin^2(pi x) below 1/2 (sin(pi x) unreduced, as torch)."""
    neg = x < 0.5
    z = torch.where(neg, 1 - x, x)
    result = 0
    for _ in range(6):
        result = result + 1 / (z * z)
        z = z + 1
    ixx = 1 / (z * z)
    result = result + (1 + 1 / (2 * z) + ixx * (1 / 6 - ixx * (1 / 30 - ixx / 42))) / z
    sin_pi_x = torch.sin(math.pi * x)
    return torch.where(neg, math.pi ** 2 / (sin_pi_x * sin_pi_x) - result, result)


# Bernoulli numbers B_2 .. B_16, for the Euler-Maclaurin tail of the Hurwitz zeta function.
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)


def _hurwitz_zeta(s, q, negative_shift: int = 0):
    """zeta(s, q) = sum_k (q + k)^-s for s > 1 by Euler-Maclaurin summation: nine terms directly
    (plus up to ``negative_shift`` more to bring a negative q above zero, valid there only for
    integer s), then the integral, half the last term and the Bernoulli corrections."""
    n = 9
    if negative_shift:
        m = torch.clamp(torch.ceil(-q), 0, negative_shift)
    total = 0
    for k in range(n + negative_shift):
        term = torch.pow(q + k, -s)
        if negative_shift and k >= n:
            term = torch.where(m > k - n, term, 0.0)
        total = total + term
    w = q + n + m if negative_shift else q + n
    b = torch.pow(w, -s)
    tail = w * b / (s - 1) + 0.5 * b
    factor = b / w  # s (s+1) ... (s+2j-2) / (2j)! * w^(-s-2j+1), built up term by term
    rising = s
    fact = 2.0
    for j, bernoulli in enumerate(_BERNOULLI):
        tail = tail + bernoulli / fact * rising * factor
        factor = factor / (w * w)
        rising = rising * (s + 2 * j + 1) * (s + 2 * j + 2)
        fact = fact * (2 * j + 3) * (2 * j + 4)
    # w^-s underflowing means the tail is negligible (and its rising factorial may overflow)
    return total + torch.where(b == 0, 0.0, tail)


def _zeta_domain(s, q, value):
    """torch's special values around an Euler-Maclaurin value: nan for s < 1, inf at s = 1 and at
    the non-positive integers q, nan for negative q with non-integer s, nan at q = inf; for s = inf
    the sum stops at its first term of 1 or inf (q = 1, q < 1), and is nan otherwise."""
    value = torch.where((q == INF) | torch.isnan(s) | torch.isnan(q), NAN, value)
    value = torch.where(torch.isinf(s), torch.where(q == 1, 1.0, torch.where(q < 1, INF, NAN)),
                        value)
    value = torch.where((q <= 0) & ~is_int(s), NAN, value)
    value = torch.where((q <= 0) & is_int(q), INF, value)
    value = torch.where(s == 1, INF, value)
    return torch.where(s < 1, NAN, value)


def special_zeta(x, q):
    """Hurwitz zeta(x, q) (Euler-Maclaurin summation; negative q, where torch requires an integer
    x, is summed directly up to q = -16)."""
    x, q = as_float(x, q)
    s_safe = torch.where((x > 1) & ~torch.isinf(x), x, 2.0)
    q_safe = torch.where((q <= 0) & is_int(q) | torch.isinf(q), 1.0, q)
    return _zeta_domain(x, q, _hurwitz_zeta(s_safe, q_safe, negative_shift=16))


def _cot_derivative_polynomial(n: int):
    """Coefficients (lowest power first) of P_n with d^n/dy^n cot(y) = P_n(cot y):
    P_0 = c, P_{k+1} = -(1 + c^2) P_k'(c)."""
    p = [0, 1]
    for _ in range(n):
        dp = [i * p[i] for i in range(1, len(p))] + [0, 0]
        p = [-(dp[i] + (dp[i - 2] if i >= 2 else 0)) for i in range(len(dp))]
    return p


def polygamma(n, x):
    """psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 2, with the reflection formula
    psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi^(n+1) P_n(cot(pi x)) for x < 0 (P_n: the nth derivative
    of cot as a polynomial in cot)."""
    (x,) = as_float(x)
    if n == 0:
        return digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    factorial = float(math.factorial(n))
    neg = x < 0
    z = torch.where(neg, 1 - x, x)
    z = torch.where(torch.isinf(z) | (z <= 0), 1.0, z)
    positive = sign * factorial * _hurwitz_zeta(torch.full_like(z, n + 1.0), z)
    cot_derivative = poly(_cot_derivative_polynomial(n)[::-1], cot_pi(x)) * math.pi ** (n + 1)
    reflected = (-1) ** n * positive - cot_derivative
    result = torch.where(neg, reflected, positive)
    result = torch.where(x == INF, NAN, result)
    return torch.where(is_int(x) & (x <= 0), sign * INF, result)


def _igamma_parts(a, x):
    """(P, Q) regularized incomplete gamma for a > 0, x > 0 finite: the series
    P = x^a e^-x / Gamma(a + 1) sum_n x^n / ((a + 1) ... (a + n)) for x < a + 1, the continued
    fraction Q = x^a e^-x / Gamma(a) / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / ...)) for
    x >= a + 1, and Temme's uniform asymptotic expansion
    Q = erfc(eta sqrt(a / 2)) / 2 + exp(-a eta^2 / 2) / sqrt(2 pi a) (C0(eta) + C1(eta) / a) for
    large a with x near a."""
    use_series = x < a + 1
    log_prefix = a * torch.log(x) - x
    series = _igamma_series(a, torch.where(use_series, x, 0.5 * a), log_prefix)
    fraction = _igamma_fraction(a, torch.where(use_series, a + 1, x), log_prefix)
    p = torch.where(use_series, series, 1 - fraction)
    q = torch.where(use_series, 1 - series, fraction)
    p_temme, q_temme = _igamma_temme(a, x)
    temme = (a > 20) & (((x - a) / a).abs() < 0.3)
    return torch.where(temme, p_temme, p), torch.where(temme, q_temme, q)


def _igamma_series(a, xs, log_prefix):
    """P by its series, 64 terms."""
    term = torch.ones_like(xs)
    total = torch.ones_like(xs)
    for k in range(1, 64):
        term = term * xs / (a + k)
        total = total + term
    return torch.exp(log_prefix - _lgamma_positive(a + 1)) * total


def _igamma_fraction(a, xc, log_prefix):
    """Q by its continued fraction, 40 levels deep, evaluated backwards."""
    depth = 40
    t = xc + 2 * depth + 1 - a
    for k in range(depth, 0, -1):
        t = xc + 2 * k - 1 - a - k * (k - a) / t
    return torch.exp(log_prefix - _lgamma_positive(a)) / t


def _igamma_temme(a, x):
    """(P, Q) by Temme's uniform asymptotic expansion (large a, x near a)."""
    d = (x - a) / a
    eta2 = 2 * (d - torch.log1p(d))
    eta = torch.sign(d) * torch.sqrt(torch.clamp(eta2, min=0.0))
    near = eta.abs() < 0.2
    eta_far = torch.where(near, 1.0, eta)
    d_far = torch.where(near, 1.0, d)
    # Taylor series of C0 and C1 at eta = 0, where their closed forms cancel
    c0_near = poly((-139 / 777600, 1 / 2835, 1 / 864, -2 / 135, 1 / 12, -1 / 3), eta)
    c0 = torch.where(near, c0_near, 1 / d_far - 1 / eta_far)
    c1_near = poly((1 / 4860, -9.902263374e-4, 1 / 378, -1 / 288, -1 / 540), eta)
    c1 = torch.where(near, c1_near,
                     1 / eta_far ** 3 - 1 / d_far ** 3 - 1 / d_far ** 2 - 1 / (12 * d_far))
    r = torch.exp(-0.5 * a * eta * eta) / torch.sqrt(2 * math.pi * a) * (c0 + c1 / a)
    arg = eta * torch.sqrt(a / 2)
    half_erfc = 0.5 * erfc_positive(arg.abs())  # the smaller of the two leading terms
    q_temme = torch.where(arg >= 0, half_erfc, 1 - half_erfc) + r
    p_temme = torch.where(arg < 0, half_erfc, 1 - half_erfc) - r
    return p_temme, q_temme


def _igamma_domain(a, x, value, lower: bool):
    """torch's special values: nan for negative arguments; at a = 0, P = 1 (Q = 0) for x > 0 and
    nan at x = 0; at x = 0, P = 0; for infinite a, P = 0 (nan if x is also infinite); at x = inf,
    P = 1."""
    one, zero = (1.0, 0.0) if lower else (0.0, 1.0)
    value = torch.where(x == INF, one, value)
    value = torch.where(a == INF, torch.where(x == INF, NAN, zero), value)
    value = torch.where(x == 0, zero, value)
    value = torch.where(a == 0, torch.where(x > 0, one, NAN), value)
    return torch.where((a < 0) | (x < 0), NAN, value)


def _igamma_safe(a, x):
    a_safe = torch.where((a > 0) & (a < INF), a, 1.0)
    x_safe = torch.where((x > 0) & (x < INF), x, 1.0)
    nan = torch.isnan(a) | torch.isnan(x)
    return [torch.where(nan, NAN, part) for part in _igamma_parts(a_safe, x_safe)]


def igamma(a, x):
    """Regularized lower incomplete gamma P(a, x) (see _igamma_parts)."""
    a, x = as_float(a, x)
    return _igamma_domain(a, x, _igamma_safe(a, x)[0], lower=True)


def igammac(a, x):
    """Regularized upper incomplete gamma Q(a, x) (see _igamma_parts)."""
    a, x = as_float(a, x)
    return _igamma_domain(a, x, _igamma_safe(a, x)[1], lower=False)
