"""Special functions (gamma family, error functions, incomplete gamma, Hurwitz zeta, Bessel
functions, Chebyshev polynomials) as elementary torch ops: torch-mlir lowers none of these ATen
ops. Each is written from the mathematics, with the series, recurrence, asymptotic expansion or
published approximation named in its docstring; all use fixed iteration counts (no data-dependent
control flow) and compute in the input's floating dtype, matching torch's special values.
"""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten

_INF = math.inf
_NAN = math.nan
_LOG_2PI_HALF = 0.5 * math.log(2 * math.pi)
_EULER = 0.57721566490153286061


# ---- shared helpers ------------------------------------------------------------------------------

def _poly(coeffs, x):
    """Horner evaluation, coefficients from the highest power down."""
    result = torch.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        result = result * x + c
    return result


def _float_dtype(*args):
    dtype = torch.result_type(*args) if len(args) > 1 else args[0].dtype
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _as_float(*args):
    """The arguments as tensors of their promoted floating dtype (torch promotes integers to the
    default dtype for these ops), on the device of the first tensor."""
    dtype = _float_dtype(*args)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    return [a.to(dtype) if isinstance(a, torch.Tensor) else torch.full((), a, dtype=dtype, device=device)
            for a in args]


def _promotes(function):
    """``function`` called with its arguments as tensors of their promoted floating dtype."""
    def promoted(*args):
        return function(*_as_float(*args))

    promoted.__name__, promoted.__doc__ = function.__name__, function.__doc__
    return promoted


def _is_int(x):
    return x == torch.floor(x)


def _cot_pi(x):
    """cot(pi x) with the argument reduced to r in [-1/2, 1/2] and cos(pi r) written as
    sin(pi (1/2 - |r|)), so it is accurate near the integers and the half-integers."""
    r = x - torch.round(x)
    return torch.sign(r) * torch.sin(math.pi * (0.5 - r.abs())) / torch.sin(math.pi * r.abs())


def _abs_sin_pi(x):
    """|sin(pi x)| with the argument reduced first, so it is accurate near the integers."""
    return torch.sin(math.pi * (x - torch.round(x))).abs()


# ---- gamma family --------------------------------------------------------------------------------

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
    return (zs - 0.5) * torch.log(zs) - zs + _LOG_2PI_HALF + series - shift


@_promotes
def lgamma(x):
    """log|Gamma(x)|: Stirling's series, with the reflection formula
    log|Gamma(x)| = log(pi / |sin(pi x)|) - log Gamma(1 - x) for x < 0."""
    neg = x < 0
    z = torch.where(neg, 1 - x, x)
    positive = _lgamma_positive(torch.where(torch.isinf(z), 1.0, z))
    reflected = math.log(math.pi) - torch.log(_abs_sin_pi(torch.where(neg, x, 0.5))) - positive
    return torch.where(torch.isinf(x) | neg & _is_int(x), _INF, torch.where(neg, reflected, positive))


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


@_promotes
def digamma(x):
    """psi(x): the asymptotic series, with psi(x) = psi(1 - x) - pi cot(pi x) for x < 0. torch
    returns nan at the negative integers and -inf at +0, +inf at -0."""
    neg = x < 0
    positive = _digamma_positive(torch.where(neg, 1 - x, x))
    reflected = positive - math.pi * _cot_pi(x)
    result = torch.where(neg, torch.where(_is_int(x), _NAN, reflected), positive)
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
    value = torch.where((q == _INF) | torch.isnan(s) | torch.isnan(q), _NAN, value)
    value = torch.where(torch.isinf(s), torch.where(q == 1, 1.0, torch.where(q < 1, _INF, _NAN)),
                        value)
    value = torch.where((q <= 0) & ~_is_int(s), _NAN, value)
    value = torch.where((q <= 0) & _is_int(q), _INF, value)
    value = torch.where(s == 1, _INF, value)
    return torch.where(s < 1, _NAN, value)


def special_zeta(x, q):
    """Hurwitz zeta(x, q) (Euler-Maclaurin summation; negative q, where torch requires an integer
    x, is summed directly up to q = -16)."""
    x, q = _as_float(x, q)
    s_safe = torch.where((x > 1) & ~torch.isinf(x), x, 2.0)
    q_safe = torch.where((q <= 0) & _is_int(q) | torch.isinf(q), 1.0, q)
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
    (x,) = _as_float(x)
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
    cot_derivative = _poly(_cot_derivative_polynomial(n)[::-1], _cot_pi(x)) * math.pi ** (n + 1)
    reflected = (-1) ** n * positive - cot_derivative
    result = torch.where(neg, reflected, positive)
    result = torch.where(x == _INF, _NAN, result)
    return torch.where(_is_int(x) & (x <= 0), sign * _INF, result)


# ---- error functions and the normal distribution ---------------------------------------------------

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


@_promotes
def special_erfcx(x):
    """Scaled complementary error function exp(x^2) erfc(x); erfcx(-x) = 2 exp(x^2) - erfcx(x)."""
    ax = x.abs()
    positive = _erfcx_positive(ax)
    return torch.where(x < 0, 2 * torch.exp(x * x) - positive, positive)


def _erfc_positive(x):
    """erfc(x) for x >= 0, accurate relative to its value in the tail."""
    return torch.where(x < 0.5, 1 - torch.erf(x), torch.exp(-x * x) * _erfcx_positive(x))


@_promotes
def erfc(x):
    """Complementary error function: 1 - erf(x) near 0, exp(-x^2) erfcx(x) in the tail,
    erfc(-x) = 2 - erfc(x)."""
    positive = _erfc_positive(x.abs())
    return torch.where(x < 0, 2 - positive, positive)


@_promotes
def special_log_ndtr(x):
    """log Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2: log1p(-erfc(x / sqrt 2) / 2) for x >= 0, and
    log(erfcx(-x / sqrt 2) / 2) - x^2 / 2 for x < 0, which stays accurate far into the left tail."""
    t = x / math.sqrt(2)
    right = torch.log1p(-0.5 * _erfc_positive(torch.where(x < 0, 0.0, t)))
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
    central = centred * _poly(_ACKLAM_A, r) / _poly(_ACKLAM_B, r)
    in_tail = tail < 0.02425
    q = torch.sqrt(-2 * torch.log(torch.where(in_tail, tail, 0.5)))
    lower = _poly(_ACKLAM_C, q) / _poly(_ACKLAM_D, q)  # the quantile of ``tail``, negative
    x = torch.where(in_tail, torch.where(centred > 0, -lower, lower), central)
    # Halley's step on Phi(|x|) - (1/2 + |centred|), the residual taken from erf in the middle and
    # from erfc in the tails
    ax = torch.where(torch.isfinite(x), x.abs(), 0.0)
    residual = torch.where(in_tail, tail - 0.5 * _erfc_positive(ax / math.sqrt(2)),
                           0.5 * torch.erf(ax / math.sqrt(2)) - centred.abs())
    u = residual * math.sqrt(2 * math.pi) * torch.exp(ax * ax / 2)
    ax = torch.where(torch.isfinite(u), ax - u / (1 + ax * u / 2), ax)
    return torch.where(torch.isfinite(x), torch.where(centred > 0, ax, -ax), x)


@_promotes
def special_ndtri(p):
    """Inverse of the standard normal CDF (see _normal_quantile); -inf at 0, inf at 1, nan outside."""
    x = _normal_quantile(p - 0.5, torch.where(p < 0.5, p, 1 - p))
    x = torch.where(p == 0, -_INF, torch.where(p == 1, _INF, x))
    return torch.where((p < 0) | (p > 1), _NAN, x)


@_promotes
def erfinv(y):
    """Inverse error function, erfinv(y) = Phi^-1((1 + y) / 2) / sqrt 2 with both halves of
    _normal_quantile taken from y exactly."""
    x = _normal_quantile(y / 2, (1 - y.abs()) / 2) / math.sqrt(2)
    x = torch.where(y.abs() == 1, y * _INF, x)
    return torch.where(y.abs() > 1, _NAN, x)


# ---- incomplete gamma ------------------------------------------------------------------------------

def _igamma_parts(a, x):
    """(P, Q) regularized incomplete gamma for a > 0, x > 0 finite: the series
    P = x^a e^-x / Gamma(a + 1) sum_n x^n / ((a + 1) ... (a + n)) for x < a + 1, the continued
    fraction Q = x^a e^-x / Gamma(a) / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / ...)) for
    x >= a + 1, and Temme's uniform asymptotic expansion
    Q = erfc(eta sqrt(a / 2)) / 2 + exp(-a eta^2 / 2) / sqrt(2 pi a) (C0(eta) + C1(eta) / a) for
    large a with x near a."""
    use_series = x < a + 1
    log_prefix = a * torch.log(x) - x
    xs = torch.where(use_series, x, 0.5 * a)
    term = torch.ones_like(x)
    total = torch.ones_like(x)
    for k in range(1, 64):
        term = term * xs / (a + k)
        total = total + term
    series = torch.exp(log_prefix - _lgamma_positive(a + 1)) * total
    # continued fraction, evaluated backwards
    xc = torch.where(use_series, a + 1, x)
    depth = 40
    t = xc + 2 * depth + 1 - a
    for k in range(depth, 0, -1):
        t = xc + 2 * k - 1 - a - k * (k - a) / t
    fraction = torch.exp(log_prefix - _lgamma_positive(a)) / t
    p = torch.where(use_series, series, 1 - fraction)
    q = torch.where(use_series, 1 - series, fraction)
    d = (x - a) / a
    eta2 = 2 * (d - torch.log1p(d))
    eta = torch.sign(d) * torch.sqrt(torch.clamp(eta2, min=0.0))
    near = eta.abs() < 0.2
    eta_far = torch.where(near, 1.0, eta)
    d_far = torch.where(near, 1.0, d)
    # Taylor series of C0 and C1 at eta = 0, where their closed forms cancel
    c0_near = _poly((-139 / 777600, 1 / 2835, 1 / 864, -2 / 135, 1 / 12, -1 / 3), eta)
    c0 = torch.where(near, c0_near, 1 / d_far - 1 / eta_far)
    c1_near = _poly((1 / 4860, -9.902263374e-4, 1 / 378, -1 / 288, -1 / 540), eta)
    c1 = torch.where(near, c1_near,
                     1 / eta_far ** 3 - 1 / d_far ** 3 - 1 / d_far ** 2 - 1 / (12 * d_far))
    r = torch.exp(-0.5 * a * eta * eta) / torch.sqrt(2 * math.pi * a) * (c0 + c1 / a)
    arg = eta * torch.sqrt(a / 2)
    half_erfc = 0.5 * _erfc_positive(arg.abs())  # the smaller of the two leading terms
    q_temme = torch.where(arg >= 0, half_erfc, 1 - half_erfc) + r
    p_temme = torch.where(arg < 0, half_erfc, 1 - half_erfc) - r
    temme = (a > 20) & (d.abs() < 0.3)
    return torch.where(temme, p_temme, p), torch.where(temme, q_temme, q)


def _igamma_domain(a, x, value, lower: bool):
    """torch's special values: nan for negative arguments; at a = 0, P = 1 (Q = 0) for x > 0 and
    nan at x = 0; at x = 0, P = 0; for infinite a, P = 0 (nan if x is also infinite); at x = inf,
    P = 1."""
    one, zero = (1.0, 0.0) if lower else (0.0, 1.0)
    value = torch.where(x == _INF, one, value)
    value = torch.where(a == _INF, torch.where(x == _INF, _NAN, zero), value)
    value = torch.where(x == 0, zero, value)
    value = torch.where(a == 0, torch.where(x > 0, one, _NAN), value)
    return torch.where((a < 0) | (x < 0), _NAN, value)


def _igamma_safe(a, x):
    a_safe = torch.where((a > 0) & (a < _INF), a, 1.0)
    x_safe = torch.where((x > 0) & (x < _INF), x, 1.0)
    nan = torch.isnan(a) | torch.isnan(x)
    return [torch.where(nan, _NAN, part) for part in _igamma_parts(a_safe, x_safe)]


def igamma(a, x):
    """Regularized lower incomplete gamma P(a, x) (see _igamma_parts)."""
    a, x = _as_float(a, x)
    return _igamma_domain(a, x, _igamma_safe(a, x)[0], lower=True)


def igammac(a, x):
    """Regularized upper incomplete gamma Q(a, x) (see _igamma_parts)."""
    a, x = _as_float(a, x)
    return _igamma_domain(a, x, _igamma_safe(a, x)[1], lower=False)


# ---- floating point ------------------------------------------------------------------------------

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


# ---- Bessel functions ------------------------------------------------------------------------------

def _hankel_coefficients(nu: float, count: int):
    """a_k(nu) = (4 nu^2 - 1^2)(4 nu^2 - 3^2) ... (4 nu^2 - (2k - 1)^2) / (k! 8^k), the coefficients
    of the large-argument expansions of I, K, J and Y."""
    coefficients, a = [1.0], 1.0
    for k in range(1, count):
        a = a * (4 * nu * nu - (2 * k - 1) ** 2) / (k * 8)
        coefficients.append(a)
    return coefficients


def _inverse_series(coefficients, r, alternate: bool):
    """sum_k (+-1)^k c_k r^k."""
    return _poly([c * (-1) ** k if alternate else c for k, c in enumerate(coefficients)][::-1], r)


def _bessel_i_scaled(nu: int, x):
    """exp(-x) I_nu(x) for x >= 0: the power series sum_k (x/2)^(2k+nu) / (k! (k+nu)!) up to 15,
    the asymptotic expansion exp(x) / sqrt(2 pi x) sum_k (-1)^k a_k(nu) / x^k above."""
    small = x <= 15
    xs = torch.where(small, x, 0.0)
    y = xs * xs / 4
    term = (xs / 2) ** nu / math.factorial(nu)
    total = term
    for k in range(1, 40):
        term = term * y / (k * (k + nu))
        total = total + term
    xl = torch.where(small, 16.0, x)
    large = _inverse_series(_hankel_coefficients(nu, 20), 1 / xl, True)
    large = large / (math.sqrt(2 * math.pi) * torch.sqrt(xl))
    return torch.where(small, total * torch.exp(-xs), large)


def _bessel_k_scaled_large(nu: float, z):
    """exp(z) K_nu(z) for z >= 2: the trapezoidal rule on exp(z) K_nu(z) =
    int_0^inf exp(-z (cosh t - 1)) cosh(nu t) dt (exponentially accurate for such integrands) up to
    15, the asymptotic expansion sqrt(pi / (2 z)) sum_k a_k(nu) / z^k above."""
    mid = z <= 15
    zm = torch.where(mid, z, 2.0)
    h = 0.2
    total = 0.5 * torch.ones_like(zm)
    for k in range(1, 24):
        t = k * h
        total = total + torch.exp(-zm * (math.cosh(t) - 1)) * math.cosh(nu * t)
    zl = torch.where(mid, 16.0, z)
    large = _inverse_series(_hankel_coefficients(nu, 20), 1 / zl, False) * torch.sqrt(math.pi / (2 * zl))
    return torch.where(mid, h * total, large)


def _bessel_k_scaled(nu: int, x, scaled: bool):
    """K_nu(x) (or exp(x) K_nu(x)) for nu = 0, 1: the series
    K_0 = -(log(x/2) + gamma) I_0 + sum_k H_k (x^2/4)^k / k!^2,
    K_1 = 1/x + log(x/2) I_1 - (x/4) sum_k (psi(k+1) + psi(k+2)) (x^2/4)^k / (k! (k+1)!) up to 2,
    then _bessel_k_scaled_large; inf at 0, nan below."""
    small = x <= 2
    xs = torch.where(small & (x > 0), x, 1.0)
    y = xs * xs / 4
    log_half = torch.log(xs / 2)
    i_nu = _bessel_i_scaled(nu, xs) * torch.exp(xs)
    term = torch.ones_like(xs) / math.factorial(nu)
    harmonic = 0.0 if nu == 0 else 1.0 - 2 * _EULER  # H_k for K_0; psi(k+1) + psi(k+2) for K_1
    total = term * harmonic
    for k in range(1, 20):
        term = term * y / (k * (k + nu))
        harmonic = harmonic + (1 / k if nu == 0 else 1 / k + 1 / (k + 1))
        total = total + term * harmonic
    if nu == 0:
        series = -(log_half + _EULER) * i_nu + total
    else:
        series = 1 / xs + log_half * i_nu - xs / 4 * total
    if scaled:
        series = series * torch.exp(xs)
    xl = torch.where(small, 2.0, x)
    large = _bessel_k_scaled_large(float(nu), xl)
    if not scaled:
        large = large * torch.exp(-xl)
    result = torch.where(small, series, large)
    return torch.where(x == 0, _INF, torch.where(x < 0, _NAN, result))


@_promotes
def special_i0e(x):
    """exp(-|x|) I_0(x) (see _bessel_i_scaled)."""
    return _bessel_i_scaled(0, x.abs())


@_promotes
def special_i1e(x):
    """exp(-|x|) I_1(x), odd (see _bessel_i_scaled)."""
    return torch.sign(x) * _bessel_i_scaled(1, x.abs())


@_promotes
def special_modified_bessel_i0(x):
    """I_0(x) (see _bessel_i_scaled); torch gives nan at +-inf."""
    ax = x.abs()
    return torch.where(torch.isinf(x), _NAN, _bessel_i_scaled(0, ax) * torch.exp(ax))


@_promotes
def special_i1(x):
    """I_1(x), odd (see _bessel_i_scaled); torch gives nan at +-inf."""
    ax = x.abs()
    return torch.where(torch.isinf(x), _NAN, torch.sign(x) * _bessel_i_scaled(1, ax) * torch.exp(ax))


def _bessel_k(order: int, scaled: bool):
    """K_order(x), times exp(x) when ``scaled`` (see _bessel_k_scaled)."""
    def k(x):
        return _bessel_k_scaled(order, x, scaled=scaled)

    k.__name__ = f"special_{'scaled_' if scaled else ''}modified_bessel_k{order}"
    return _promotes(k)


special_modified_bessel_k0, special_modified_bessel_k1 = _bessel_k(0, False), _bessel_k(1, False)
special_scaled_modified_bessel_k0, special_scaled_modified_bessel_k1 = _bessel_k(0, True), _bessel_k(1, True)


def _bessel_jy(nu: int, x, kind: str):
    """J_nu or Y_nu (nu = 0, 1) for x > 0: the power series up to 8,
    J_nu = sum_k (-1)^k (x/2)^(2k+nu) / (k! (k+nu)!),
    Y_0 = (2/pi) (log(x/2) + gamma) J_0 - (2/pi) sum_k (-1)^k H_k (x^2/4)^k / k!^2,
    Y_1 = -2/(pi x) + (2/pi) log(x/2) J_1
          - (x/(2 pi)) sum_k (-1)^k (psi(k+1) + psi(k+2)) (x^2/4)^k / (k! (k+1)!);
    Hankel's expansion sqrt(2/(pi x)) (P cos w - Q sin w) (J) or (P sin w + Q cos w) (Y),
    w = x - (2 nu + 1) pi / 4, above."""
    small = x <= 8
    xs = torch.where(small, x, 1.0)
    y = -xs * xs / 4
    term = (xs / 2) ** nu / math.factorial(nu)
    j = term
    unit = torch.ones_like(xs) / math.factorial(nu)
    harmonic = 0.0 if nu == 0 else 1.0 - 2 * _EULER
    other = unit * harmonic
    for k in range(1, 30):
        term = term * y / (k * (k + nu))
        unit = unit * y / (k * (k + nu))
        harmonic = harmonic + (1 / k if nu == 0 else 1 / k + 1 / (k + 1))
        j = j + term
        other = other + unit * harmonic
    if kind == "j":
        series = j
    elif nu == 0:
        series = 2 / math.pi * ((torch.log(xs / 2) + _EULER) * j - other)
    else:
        series = -2 / (math.pi * xs) + 2 / math.pi * torch.log(xs / 2) * j - xs / (2 * math.pi) * other
    xl = torch.where(small, 9.0, x)
    a = _hankel_coefficients(nu, 24)
    r2 = 1 / (xl * xl)
    p = _inverse_series(a[0::2], r2, True)
    q = _inverse_series(a[1::2], r2, True) / xl
    w = xl - (2 * nu + 1) * math.pi / 4
    c, s = torch.cos(w), torch.sin(w)
    large = torch.sqrt(2 / (math.pi * xl)) * (p * c - q * s if kind == "j" else p * s + q * c)
    return torch.where(small, series, large)


@_promotes
def special_bessel_j0(x):
    """J_0(x), even (see _bessel_jy); nan at +-inf as torch."""
    return torch.where(torch.isinf(x), _NAN, _bessel_jy(0, x.abs(), "j"))


@_promotes
def special_bessel_j1(x):
    """J_1(x), odd (see _bessel_jy); nan at +-inf as torch."""
    return torch.where(torch.isinf(x), _NAN, torch.sign(x) * _bessel_jy(1, x.abs(), "j"))


def _bessel_y(nu: int, x):
    result = _bessel_jy(nu, torch.where(x > 0, x, 1.0), "y")
    result = torch.where(x == 0, -_INF, torch.where(x < 0, _NAN, result))
    return torch.where(torch.isinf(x) | torch.isnan(x), _NAN, result)


@_promotes
def special_bessel_y0(x):
    """Y_0(x) (see _bessel_jy); -inf at 0, nan for x < 0 and at inf."""
    return _bessel_y(0, x)


@_promotes
def special_bessel_y1(x):
    """Y_1(x) (see _bessel_jy); -inf at 0, nan for x < 0 and at inf."""
    return _bessel_y(1, x)


@_promotes
def special_spherical_bessel_j0(x):
    """sin(x) / x, 1 at 0 and 0 at +-inf."""
    xs = torch.where((x == 0) | torch.isinf(x), 1.0, x)
    return torch.where(x == 0, 1.0, torch.where(torch.isinf(x), 0.0, torch.sin(xs) / xs))


def _airy_u(count: int):
    """u_k = Gamma(3k + 1/2) / (54^k k! Gamma(k + 1/2)), the coefficients of Airy's expansions."""
    return [math.exp(math.lgamma(3 * k + 0.5) - math.lgamma(k + 0.5) - math.lgamma(k + 1)) / 54 ** k
            for k in range(count)]


@_promotes
def special_airy_ai(x):
    """Ai(x): the Maclaurin series Ai(0) f(x) + Ai'(0) g(x) on [-5, 2], Ai(x) = sqrt(x/3) K_{1/3}(zeta)
    / pi (zeta = 2/3 x^(3/2), see _bessel_k_scaled_large) above, and the oscillatory expansion
    Ai(-x) = (sin(zeta + pi/4) sum_k (-1)^k u_2k zeta^-2k - cos(zeta + pi/4)
    sum_k (-1)^k u_2k+1 zeta^-2k-1) / (sqrt(pi) x^(1/4)) below."""
    small = (x >= -5) & (x <= 2)
    xs = torch.where(small, x, 0.0)
    x3 = xs * xs * xs
    f_term = torch.ones_like(xs)
    g_term = xs
    f, g = f_term, g_term
    for k in range(1, 40):
        f_term = f_term * x3 / ((3 * k - 1) * (3 * k))
        g_term = g_term * x3 / ((3 * k) * (3 * k + 1))
        f, g = f + f_term, g + g_term
    series = 0.355028053887817239 * f - 0.258819403792806798 * g
    xp = torch.where(x > 2, x, 4.0)
    zeta = 2 / 3 * xp * torch.sqrt(xp)
    positive = torch.sqrt(xp / 3) / math.pi * torch.exp(-zeta) * _bessel_k_scaled_large(1 / 3, zeta)
    xn = torch.where(x < -5, -x, 6.0)
    zeta = 2 / 3 * xn * torch.sqrt(xn)
    u = _airy_u(16)  # the expansion diverges: 16 terms is near the optimal truncation at zeta = 7.5
    r2 = 1 / (zeta * zeta)
    even = _inverse_series(u[0::2], r2, True)
    odd = _inverse_series(u[1::2], r2, True) / zeta
    phase = zeta + math.pi / 4
    negative = (torch.sin(phase) * even - torch.cos(phase) * odd) / (math.sqrt(math.pi) * xn ** 0.25)
    result = torch.where(small, series, torch.where(x > 2, positive, negative))
    return torch.where(torch.isinf(x) | torch.isnan(x), _NAN, result)


# ---- Chebyshev polynomials -------------------------------------------------------------------------

def _chebyshev(kind: str, x, n):
    """T_n, U_n, V_n, W_n for every integer degree at once through their trigonometric forms
    (x = cos t): cos(n t), sin((n+1) t) / sin t, cos((n+1/2) t) / cos(t/2), sin((n+1/2) t) / sin(t/2),
    hyperbolic above |x| = 1 (x = cosh t), with T_n(-x) = (-1)^n T_n(x), U likewise, and
    V_n(-x) = (-1)^n W_n(x). As torch: the degree is truncated to an integer, negative degrees give 0,
    and at x = +-inf the three-term recurrence torch runs gives inf - inf = nan from degree 3 on."""
    n = torch.trunc(n)
    sign = 1 - 2 * torch.remainder(n, 2)
    y = x.abs()
    use_w = (x < 0) if kind == "v" else ~(x < 0)  # V and W swap under x -> -x
    inside = y < 1
    yi = torch.where(inside, y, 0.5)
    yo = torch.where(inside | torch.isinf(y), 2.0, y)
    ti = torch.acos(yi)
    to = torch.acosh(yo)

    def inside_form(t):
        if kind == "t":
            return torch.cos(n * t)
        if kind == "u":
            return torch.sin((n + 1) * t) / torch.sin(t)
        v = torch.cos((n + 0.5) * t) / torch.cos(t / 2)
        w = torch.sin((n + 0.5) * t) / torch.sin(t / 2)
        return torch.where(use_w, w, v)

    def outside_form(t, n):
        # (e^(m t) +- e^(-m t)) / (2 d), written so it overflows only when the value does
        if kind == "t":
            m, d, sign_ = n, torch.ones_like(t), 1
        elif kind == "u":
            m, d, sign_ = n + 1, torch.sinh(t), -1
        else:
            m, d = n + 0.5, torch.where(use_w, torch.sinh(t / 2), torch.cosh(t / 2))
            sign_ = torch.where(use_w, -1.0, 1.0)
        return torch.exp(m * t - torch.log(2 * d)) * (1 + sign_ * torch.exp(-2 * m * t))

    outside = outside_form(to, n)
    # torch's recurrence P_n = 2x P_(n-1) - P_(n-2) gives inf - inf = nan once P_(n-2) overflowed
    outside = torch.where(torch.isinf(outside_form(to, n - 2)), _NAN, outside)
    value = torch.where(inside, inside_form(ti), outside)
    at_one = {"t": torch.ones_like(n), "u": n + 1}.get(kind)
    if at_one is None:
        at_one = torch.where(use_w, 2 * n + 1, 1.0)
    value = torch.where(y == 1, at_one, value)
    value = torch.where(x < 0, sign * value, value)
    # x = +-inf: degree 0 gives 1, degree 1 the leading term (a multiple of x), degree 2 +inf
    lead = {"t": x, "u": 2 * x, "v": 2 * x, "w": 2 * x}[kind]
    infinite = torch.where(n == 0, 1.0, torch.where(n == 1, lead, torch.where(n == 2, _INF, _NAN)))
    value = torch.where(torch.isinf(x), infinite, value)
    return torch.where(n < 0, 0.0, torch.where(n == 0, 1.0, value))


def _chebyshev_op(kind: str, shifted: bool):
    def polynomial(x, n):
        x, n = _as_float(x, n)
        x, n = torch.broadcast_tensors(x, n)
        return _chebyshev(kind, 2 * x - 1 if shifted else x, n)

    prefix = "shifted_" if shifted else ""
    polynomial.__name__ = f"special_{prefix}chebyshev_polynomial_{kind}"
    polynomial.__doc__ = (f"{'Shifted ' if shifted else ''}Chebyshev polynomial of the "
                          f"{'first second third fourth'.split()['tuvw'.index(kind)]} kind"
                          f"{' at 2x - 1' if shifted else ''} (see _chebyshev).")
    return polynomial


_CHEBYSHEV = {f"{prefix}chebyshev_polynomial_{kind}": _chebyshev_op(kind, bool(prefix))
              for prefix in ("", "shifted_") for kind in "tuvw"}

SPECIAL_FUNCTIONS = {
    aten.lgamma.default: lgamma,
    aten.digamma.default: digamma,
    aten.polygamma.default: polygamma,
    aten.special_zeta.default: special_zeta,
    aten.special_zeta.self_scalar: special_zeta,
    aten.special_zeta.other_scalar: special_zeta,
    aten.erfinv.default: erfinv,
    aten.erfc.default: erfc,
    aten.special_erfcx.default: special_erfcx,
    aten.special_ndtri.default: special_ndtri,
    aten.special_log_ndtr.default: special_log_ndtr,
    aten.nextafter.default: nextafter,
    aten.igamma.default: igamma,
    aten.igammac.default: igammac,
    aten.special_i0e.default: special_i0e,
    aten.special_i1.default: special_i1,
    aten.special_i1e.default: special_i1e,
    aten.special_modified_bessel_i0.default: special_modified_bessel_i0,
    aten.i0.default: special_modified_bessel_i0,
    aten.special_modified_bessel_i1.default: special_i1,
    aten.special_modified_bessel_k0.default: special_modified_bessel_k0,
    aten.special_modified_bessel_k1.default: special_modified_bessel_k1,
    aten.special_scaled_modified_bessel_k0.default: special_scaled_modified_bessel_k0,
    aten.special_scaled_modified_bessel_k1.default: special_scaled_modified_bessel_k1,
    aten.special_bessel_j0.default: special_bessel_j0,
    aten.special_bessel_j1.default: special_bessel_j1,
    aten.special_bessel_y0.default: special_bessel_y0,
    aten.special_bessel_y1.default: special_bessel_y1,
    aten.special_spherical_bessel_j0.default: special_spherical_bessel_j0,
    aten.special_airy_ai.default: special_airy_ai,
}
for _name, _function in _CHEBYSHEV.items():
    for _overload in ("default", "x_scalar", "n_scalar"):
        SPECIAL_FUNCTIONS[getattr(getattr(aten, "special_" + _name), _overload)] = _function
