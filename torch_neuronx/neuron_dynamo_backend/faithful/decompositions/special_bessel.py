"""Bessel functions (I, K, J, Y, spherical j0, Airy Ai) and Chebyshev polynomials. As elementary ops, by the
rules of :mod:`.special_common`."""
from __future__ import annotations

import functools
import math

import torch

from torch_neuronx.neuron_dynamo_backend.faithful.decompositions.special_common import (
    EULER, INF, NAN, as_float, poly, promotes)


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
    return poly([c * (-1) ** k if alternate else c for k, c in enumerate(coefficients)][::-1], r)


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
    harmonic = 0.0 if nu == 0 else 1.0 - 2 * EULER  # H_k for K_0; psi(k+1) + psi(k+2) for K_1
    total = term * harmonic
    for k in range(1, 20):
        term = term * y / (k * (k + nu))
        harmonic = harmonic + (1 / k if nu == 0 else 1 / k + 1 / (k + 1))
        total = total + term * harmonic
    if nu == 0:
        series = -(log_half + EULER) * i_nu + total
    else:
        series = 1 / xs + log_half * i_nu - xs / 4 * total
    if scaled:
        series = series * torch.exp(xs)
    xl = torch.where(small, 2.0, x)
    large = _bessel_k_scaled_large(float(nu), xl)
    if not scaled:
        large = large * torch.exp(-xl)
    result = torch.where(small, series, large)
    return torch.where(x == 0, INF, torch.where(x < 0, NAN, result))


@promotes
def special_i0e(x):
    """exp(-|x|) I_0(x) (see _bessel_i_scaled)."""
    return _bessel_i_scaled(0, x.abs())


@promotes
def special_i1e(x):
    """exp(-|x|) I_1(x), odd (see _bessel_i_scaled)."""
    return torch.sign(x) * _bessel_i_scaled(1, x.abs())


@promotes
def special_modified_bessel_i0(x):
    """I_0(x) (see _bessel_i_scaled); torch gives nan at +-inf."""
    ax = x.abs()
    return torch.where(torch.isinf(x), NAN, _bessel_i_scaled(0, ax) * torch.exp(ax))


@promotes
def special_i1(x):
    """I_1(x), odd (see _bessel_i_scaled); torch gives nan at +-inf."""
    ax = x.abs()
    return torch.where(torch.isinf(x), NAN, torch.sign(x) * _bessel_i_scaled(1, ax) * torch.exp(ax))


def _bessel_k(order: int, scaled: bool):
    """K_order(x), times exp(x) when ``scaled`` (see _bessel_k_scaled)."""
    def k(x):
        return _bessel_k_scaled(order, x, scaled=scaled)

    k.__name__ = f"special_{'scaled_' if scaled else ''}modified_bessel_k{order}"
    return promotes(k)


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
    harmonic = 0.0 if nu == 0 else 1.0 - 2 * EULER
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
        series = 2 / math.pi * ((torch.log(xs / 2) + EULER) * j - other)
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


@promotes
def special_bessel_j0(x):
    """J_0(x), even (see _bessel_jy); nan at +-inf as torch."""
    return torch.where(torch.isinf(x), NAN, _bessel_jy(0, x.abs(), "j"))


@promotes
def special_bessel_j1(x):
    """J_1(x), odd (see _bessel_jy); nan at +-inf as torch."""
    return torch.where(torch.isinf(x), NAN, torch.sign(x) * _bessel_jy(1, x.abs(), "j"))


def _bessel_y(nu: int, x):
    result = _bessel_jy(nu, torch.where(x > 0, x, 1.0), "y")
    result = torch.where(x == 0, -INF, torch.where(x < 0, NAN, result))
    return torch.where(torch.isinf(x) | torch.isnan(x), NAN, result)


@promotes
def special_bessel_y0(x):
    """Y_0(x) (see _bessel_jy); -inf at 0, nan for x < 0 and at inf."""
    return _bessel_y(0, x)


@promotes
def special_bessel_y1(x):
    """Y_1(x) (see _bessel_jy); -inf at 0, nan for x < 0 and at inf."""
    return _bessel_y(1, x)


@promotes
def special_spherical_bessel_j0(x):
    """sin(x) / x, 1 at 0 and 0 at +-inf."""
    xs = torch.where((x == 0) | torch.isinf(x), 1.0, x)
    return torch.where(x == 0, 1.0, torch.where(torch.isinf(x), 0.0, torch.sin(xs) / xs))


def _airy_u(count: int):
    """u_k = Gamma(3k + 1/2) / (54^k k! Gamma(k + 1/2)), the coefficients of Airy's expansions."""
    return [math.exp(math.lgamma(3 * k + 0.5) - math.lgamma(k + 0.5) - math.lgamma(k + 1)) / 54 ** k
            for k in range(count)]


@promotes
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
    return torch.where(torch.isinf(x) | torch.isnan(x), NAN, result)


def _chebyshev_inside(kind: str, use_w, t, n):
    """The polynomial of degree ``n`` at x = cos t (|x| < 1)."""
    if kind == "t":
        return torch.cos(n * t)
    if kind == "u":
        return torch.sin((n + 1) * t) / torch.sin(t)
    v = torch.cos((n + 0.5) * t) / torch.cos(t / 2)
    w = torch.sin((n + 0.5) * t) / torch.sin(t / 2)
    return torch.where(use_w, w, v)


def _chebyshev_outside(kind: str, use_w, t, n):
    """The polynomial of degree ``n`` at x = cosh t (|x| > 1): (e^(m t) +- e^(-m t)) / (2 d), written
    so it overflows only when the value does."""
    if kind == "t":
        m, d, sign_ = n, torch.ones_like(t), 1
    elif kind == "u":
        m, d, sign_ = n + 1, torch.sinh(t), -1
    else:
        m, d = n + 0.5, torch.where(use_w, torch.sinh(t / 2), torch.cosh(t / 2))
        sign_ = torch.where(use_w, -1.0, 1.0)
    return torch.exp(m * t - torch.log(2 * d)) * (1 + sign_ * torch.exp(-2 * m * t))


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
    outside_form = functools.partial(_chebyshev_outside, kind, use_w)
    outside = outside_form(to, n)
    # torch's recurrence P_n = 2x P_(n-1) - P_(n-2) gives inf - inf = nan once P_(n-2) overflowed
    outside = torch.where(torch.isinf(outside_form(to, n - 2)), NAN, outside)
    value = torch.where(inside, _chebyshev_inside(kind, use_w, ti, n), outside)
    at_one = {"t": torch.ones_like(n), "u": n + 1}.get(kind)
    if at_one is None:
        at_one = torch.where(use_w, 2 * n + 1, 1.0)
    value = torch.where(y == 1, at_one, value)
    value = torch.where(x < 0, sign * value, value)
    # x = +-inf: degree 0 gives 1, degree 1 the leading term (a multiple of x), degree 2 +inf
    lead = {"t": x, "u": 2 * x, "v": 2 * x, "w": 2 * x}[kind]
    infinite = torch.where(n == 0, 1.0, torch.where(n == 1, lead, torch.where(n == 2, INF, NAN)))
    value = torch.where(torch.isinf(x), infinite, value)
    return torch.where(n < 0, 0.0, torch.where(n == 0, 1.0, value))


def _chebyshev_op(kind: str, shifted: bool):
    def polynomial(x, n):
        x, n = as_float(x, n)
        x, n = torch.broadcast_tensors(x, n)
        return _chebyshev(kind, 2 * x - 1 if shifted else x, n)

    prefix = "shifted_" if shifted else ""
    polynomial.__name__ = f"special_{prefix}chebyshev_polynomial_{kind}"
    polynomial.__doc__ = (f"{'Shifted ' if shifted else ''}Chebyshev polynomial of the "
                          f"{'first second third fourth'.split()['tuvw'.index(kind)]} kind"
                          f"{' at 2x - 1' if shifted else ''} (see _chebyshev).")
    return polynomial


CHEBYSHEV = {f"{prefix}chebyshev_polynomial_{kind}": _chebyshev_op(kind, bool(prefix))
              for prefix in ("", "shifted_") for kind in "tuvw"}
