"""Fit the step-time model to probe measurements, and describe the fit. Pure: no I/O.

Decode probes give step(B, ctx) = c0 + c_decode·B + c_ctx·B·ctx (least squares, coefficients
kept ≥ 0); prefill probes give the TTFT line (round trip + frontend + c0) + (c_prefill + c_ctx)·P.
Every length is in the probed server's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from router.sim.timing import StepTimeModel


class CalibrationError(RuntimeError):
    """The server could not be probed or the probes do not determine the model."""


@dataclass(slots=True)
class Measurements:
    model: str
    max_model_len: int
    version: str | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    # (streams sent, streams the server ran at once, mean context, median step s)
    decode: list[tuple[int, int, float, float]] = field(default_factory=list)
    prefill: list[tuple[int, float]] = field(default_factory=list)  # (prompt tokens, ttft s)
    round_trip: float = 0.0  # an idle request/response without generation, seconds
    # Server tokens per simulator token (4 characters) on plain text: how much longer a text
    # prompt is on this server than in the simulator. Informational: the fit is per server token.
    token_ratio: float = 1.0


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


def fit(m: Measurements) -> StepTimeModel:
    if len(m.decode) < 3 or len(m.prefill) < 2:
        raise CalibrationError("not enough probe points to fit")
    rows = [[1.0, float(b), b * ctx] for _, b, ctx, _ in m.decode]
    c0, c_decode, c_ctx = nonnegative_least_squares(rows, [t for *_, t in m.decode])
    intercept, slope = nonnegative_least_squares(
        [[1.0, float(p)] for p, _ in m.prefill], [t for _, t in m.prefill]
    )
    return StepTimeModel(
        c0=c0,
        c_prefill=max(0.0, slope - c_ctx),
        c_decode=c_decode,
        c_ctx=c_ctx,
        frontend_s=max(0.0, intercept - c0 - m.round_trip),
    )


def report(m: Measurements, timing: StepTimeModel) -> list[str]:
    """The probe points beside the fitted model's predictions."""
    lines = ["decode probes: streams sent, run at once, mean context, measured step ms, model step ms"]
    for sent, b, ctx, t in m.decode:
        model = timing.step_time(0, b, round(b * ctx))
        lines.append(f"  {sent:4d} {b:4d} {ctx:8.0f} {t * 1e3:9.3f} {model * 1e3:9.3f}")
    lines.append("prefill probes: prompt tokens, measured TTFT ms, model TTFT ms (with round trip)")
    for p, t in m.prefill:
        model = m.round_trip + timing.frontend_s + timing.step_time(p, 0, p)
        lines.append(f"  {p:6d} {t * 1e3:9.3f} {model * 1e3:9.3f}")
    lines.append(f"idle HTTP round trip: {m.round_trip * 1e3:.3f} ms (not part of frontend_s)")
    lines.append(f"server tokens per simulator token on plain text: {m.token_ratio:.3f}")
    return lines
