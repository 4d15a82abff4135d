"""Fit the step-time model to probe measurements, and describe the fit. Pure: no I/O.

Decode probes give step(B, ctx) = c0 + c_decode·B + c_ctx·B·ctx (least squares, coefficients
kept ≥ 0); prefill probes give the TTFT curve (round trip + frontend + c0) + (c_prefill + c_ctx)·P
+ c_attn·P(P+1)/2, the last term being the causal attention pairs of a P-token prompt.
Burst probes, when the server reports vLLM's queue and prefill histograms, give the API
server's serial costs (`router.lab.sim.frontendfit`). Every length is in the probed server's tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from router.lab.sim.config import EngineConfig
from router.lab.sim.frontendfit import MIN_POINTS, BurstPoint, fit_frontend, modelled_overheads
from router.lab.sim.lsq import CalibrationError as CalibrationError
from router.lab.sim.lsq import least_squares as least_squares
from router.lab.sim.lsq import nonnegative_least_squares as nonnegative_least_squares
from router.lab.sim.timing import StepTimeModel, prefill_pairs


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
    bursts: list[BurstPoint] = field(default_factory=list)  # the API server's probes, if any
    round_trip: float = 0.0  # an idle request/response without generation, seconds
    # Server tokens per simulator token (4 characters) on plain text: how much longer a text
    # prompt is on this server than in the simulator. Informational: the fit is per server token.
    token_ratio: float = 1.0


def fit(m: Measurements, config: EngineConfig | None = None) -> StepTimeModel:
    """The step model from the decode and prefill probes; with burst probes, the API server's
    serial costs too (replayed on `config`, the engine the preset will have)."""
    if len(m.decode) < 3 or len(m.prefill) < 3:
        raise CalibrationError("not enough probe points to fit")
    rows = [[1.0, float(b), b * ctx] for _, b, ctx, _ in m.decode]
    c0, c_decode, c_ctx = nonnegative_least_squares(rows, [t for *_, t in m.decode])
    # Time columns scaled to milliseconds per 1,000 tokens / 1e6 pairs keep the normal
    # equations well conditioned.
    intercept, slope, quad = nonnegative_least_squares(
        [[1.0, p / 1e3, prefill_pairs(0, p) / 1e6] for p, _ in m.prefill], [t for _, t in m.prefill]
    )
    timing = StepTimeModel(
        c0=c0,
        c_prefill=max(0.0, slope / 1e3 - c_ctx),
        c_decode=c_decode,
        c_ctx=c_ctx,
        frontend_s=max(0.0, intercept - c0 - m.round_trip),
        c_attn=quad / 1e6,
    )
    if len(m.bursts) < MIN_POINTS:
        # No histograms to read, or too few probes readable: the frontend stays parallel latency
        # (the report says which).
        return timing
    front = fit_frontend(m.bursts, timing, config or EngineConfig(max_model_len=m.max_model_len))
    # The prefill probes' line holds the admission's cost (per request and per prompt token)
    # and the handing over of the first token; the rest of its intercept is parallel latency.
    # The line stays as measured: lone requests are the most precise probes there are.
    serial = front.request_s + front.output_token_s
    return dataclasses.replace(
        timing.with_frontend(front.request_s, front.prompt_token_s, front.output_token_s),
        c_prefill=max(0.0, timing.c_prefill - front.prompt_token_s),
        frontend_s=max(0.0, timing.frontend_s - serial),
    )


def report(m: Measurements, timing: StepTimeModel, config: EngineConfig | None = None) -> list[str]:
    """The probe points beside the fitted model's predictions."""
    lines = ["decode probes: streams sent, run at once, mean context, measured step ms, model step ms"]
    for sent, b, ctx, t in m.decode:
        model = timing.step_time(0, b, round(b * ctx))
        lines.append(f"  {sent:4d} {b:4d} {ctx:8.0f} {t * 1e3:9.3f} {model * 1e3:9.3f}")
    lines.append("prefill probes: prompt tokens, measured TTFT ms, model TTFT ms (with round trip)")
    for p, t in m.prefill:
        model = m.round_trip + timing.frontend_s + timing.admission_cost(p) + timing.prefill_time(p)
        model += timing.output_cost(1)
        lines.append(f"  {p:6d} {t * 1e3:9.3f} {model * 1e3:9.3f}")
    if m.bursts:
        lines.append(
            "frontend probes: streams, burst, prompt tokens, measured overhead ms, model overhead ms"
        )
        lines.append("  (overhead: client TTFT minus the server's queue + prefill time)")
        config = config or EngineConfig(max_model_len=m.max_model_len)
        modelled = modelled_overheads(timing, config, m.bursts, m.round_trip)
        for pt, model in zip(m.bursts, modelled, strict=True):
            lines.append(
                f"  {pt.streams:4d} {pt.burst:4d} {pt.prompt:6d} {pt.overhead * 1e3:9.3f} {model * 1e3:9.3f}"
            )
    if 0 < len(m.bursts) < MIN_POINTS:
        lines.append(f"frontend not fitted: {len(m.bursts)} readable burst probes, {MIN_POINTS} needed")
    lines.append(f"idle HTTP round trip: {m.round_trip * 1e3:.3f} ms (not part of frontend_s)")
    lines.append(f"server tokens per simulator token on plain text: {m.token_ratio:.3f}")
    return lines
