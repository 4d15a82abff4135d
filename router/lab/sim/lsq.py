"""Small least-squares solvers for calibration (a handful of columns, no numpy). Pure."""

from __future__ import annotations

from collections.abc import Sequence


class CalibrationError(RuntimeError):
    """The server could not be probed or the probes do not determine the model."""


def least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Ordinary least squares by the normal equations (a handful of columns)."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) < 1e-300:
            raise CalibrationError("the probes do not determine every coefficient")
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [x - f * y for x, y in zip(a[i], a[col], strict=True)]
                b[i] -= f * b[col]
    return [b[i] / a[i][i] for i in range(k)]


def nonnegative_least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares with every coefficient ≥ 0: drop the most negative column and refit."""
    active = list(range(len(rows[0])))
    while active:
        coef = least_squares([[r[i] for i in active] for r in rows], ys)
        worst = min(range(len(active)), key=lambda i: coef[i])
        if coef[worst] >= 0:
            out = [0.0] * len(rows[0])
            for i, c in zip(active, coef, strict=True):
                out[i] = c
            return out
        del active[worst]
    return [0.0] * len(rows[0])
