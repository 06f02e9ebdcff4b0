"""Nelder and Mead's simplex search for the minimum of a function of a few variables: what the
time model's fit uses (no solver library is a dependency of this package)."""
from __future__ import annotations


def _shrink(simplex, f, best):
    return [(f(p), p) for p in [[b + 0.5 * (x - b) for x, b in zip(point, best)] for _, point in simplex]]


def nelder_mead(f, start: list[float], step: float = 0.3, iterations: int = 400, tolerance: float = 1e-9):
    """(the point minimizing ``f`` found from ``start``, f there): a simplex of ``start`` and one
    point ``step`` away along each axis, reflected, expanded, contracted and shrunk (the standard
    coefficients 1, 2, 1/2, 1/2) until its values agree within ``tolerance`` or ``iterations`` pass."""
    points = [list(start)] + [[x + (step if i == j else 0.0) for j, x in enumerate(start)] for i in range(len(start))]
    simplex = sorted(((f(p), p) for p in points), key=lambda s: s[0])
    for _ in range(iterations):
        if simplex[-1][0] - simplex[0][0] <= tolerance:
            break
        rest = simplex[:-1]
        centre = [sum(p[i] for _, p in rest) / len(rest) for i in range(len(start))]
        worst_value, worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centre, worst)]
        r_value = f(reflected)
        if r_value < simplex[0][0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centre, worst)]
            e_value = f(expanded)
            simplex[-1] = (e_value, expanded) if e_value < r_value else (r_value, reflected)
        elif r_value < simplex[-2][0]:
            simplex[-1] = (r_value, reflected)
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
            c_value = f(contracted)
            if c_value < worst_value:
                simplex[-1] = (c_value, contracted)
            else:
                simplex = _shrink(simplex, f, simplex[0][1])
        simplex.sort(key=lambda s: s[0])
    value, point = simplex[0]
    return point, value
