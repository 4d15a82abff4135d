"""Fit the API server's serial costs (`router.lab.sim.frontend`) to burst probes. Pure: no I/O.

A burst probe: K streams decode (short prompts, long outputs); once each has produced a few
tokens, N requests of P prompt tokens arrive at once. For each burst request the probe takes
the client's time to first token minus what the server's engine core reports for it (vLLM's
`vllm:request_queue_time_seconds` + `vllm:request_prefill_time_seconds`): the first-token
latency spent outside the engine core — round trip, the API server's queue and work in both
directions, and waiting for the step under way to end. Subtracting the engine's own times keeps
the step model's errors out of this fit.

The fit replays every probe on the virtual clock, with the step model already fitted and
candidate frontend coefficients, and finds the coefficients and a constant (round trip plus
parallel latency) whose simulated overheads match the measured ones: Gauss–Newton with
finite-difference slopes, every coefficient kept ≥ 0.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from router.lab.sim.config import EngineConfig
from router.lab.sim.lsq import CalibrationError, nonnegative_least_squares
from router.lab.sim.timing import StepTimeModel
from router.lab.sim.vclock import TraceRequest, VirtualBackend, simulate

BACKGROUND_PROMPT = 32  # prompt tokens of each decoding stream
BACKGROUND_TOKENS = 256  # output tokens the real probe asks of each decoding stream
WARM_TOKENS = 8  # tokens every decoding stream has produced before the burst
BURST_TOKENS = 2  # output tokens of each burst request
MIN_POINTS = 4  # three serial costs and a constant
_BURSTS = 12  # simulated bursts per probe with decoding streams, at spread phases of a step
_GOLDEN = 0.6180339887498949  # successive bursts' phases never repeat and stay evenly spread
# A fit on a noisy host may put an idle engine's step at 0 s; no real step is shorter than this.
_MIN_STEP_S = 1e-4
_ITERATIONS = 8
# Coefficient units inside the fit (request s, prompt-token s, output-token s): keeps the
# normal equations well conditioned and the finite-difference steps comparable.
_UNITS = (1e-3, 1e-6, 1e-4)


@dataclass(frozen=True, slots=True)
class BurstPoint:
    streams: int  # K decoding streams
    burst: int  # N simultaneous requests
    prompt: int  # P prompt tokens of each burst request
    overhead: float  # mean client TTFT minus the server's queue + prefill time, seconds


@dataclass(frozen=True, slots=True)
class FrontendFit:
    constant: float  # round trip + the frontend's parallel latency, seconds
    request_s: float
    prompt_token_s: float
    output_token_s: float


def _completion(rid: str, t: float, first_id: int, prompt: int, tokens: int) -> TraceRequest:
    ids = [3 + (first_id + i * 7919) % 1997 for i in range(prompt)]
    body = {"model": "probe", "prompt": ids, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
    return TraceRequest(rid, t, body, kind="completion")


def _burst_trace(
    timing: StepTimeModel, point: BurstPoint, bursts: int, background_tokens: int
) -> list[TraceRequest]:
    """Streams from 0; once they decode, `bursts` bursts one after the other, each given time
    to drain, their starts spread evenly over the phases of a decode step."""
    k, n = point.streams, point.burst
    step = max(timing.step_time(0, k, k * (BACKGROUND_PROMPT + WARM_TOKENS)), _MIN_STEP_S)
    admit = k * timing.admission_cost(BACKGROUND_PROMPT)
    warm = (
        admit
        + timing.prefill_time(k * BACKGROUND_PROMPT)
        + (WARM_TOKENS + 2) * (step + timing.output_cost(k))
    )
    drain = n * timing.admission_cost(point.prompt) + timing.prefill_time(n * point.prompt) + 4 * step
    gap = step * (math.ceil(drain / step) + _GOLDEN)  # a new phase of the step each time
    trace = [_completion(f"stream-{i}", 0.0, 17 * i, BACKGROUND_PROMPT, background_tokens) for i in range(k)]
    for j in range(bursts):
        start = (warm if k else 0.0) + j * gap
        trace += [
            _completion(f"burst-{j}-{i}", start, 1000 + 31 * i + 7 * j, point.prompt, BURST_TOKENS)
            for i in range(n)
        ]
    return trace


def simulated_overhead(timing: StepTimeModel, config: EngineConfig, point: BurstPoint) -> float:
    """The mean overhead the model gives the burst's requests, over bursts that meet the
    decoding streams' steps at evenly spread phases."""
    backend = VirtualBackend("probe", "probe", config, timing, served_model_names=("probe",))
    bursts = _BURSTS if point.streams else 1
    tokens = WARM_TOKENS + 16 * bursts
    while True:
        result = simulate([backend], _burst_trace(timing, point, bursts, tokens), lambda _s, _t: 0)
        burst = [r for r in result.records if r.request_id.startswith("burst-")]
        streams = [r.finish or 0.0 for r in result.records if r.request_id.startswith("stream-")]
        last = max(r.first_token or 0.0 for r in burst)
        if min(streams, default=math.inf) > last or tokens > 8 * BACKGROUND_TOKENS:
            break
        tokens *= 2  # the streams must outlast the bursts
    # The first request of a burst meets the decoding streams' step under way at a random
    # point of it on a real server: its wait for that step's end is taken at its expectation,
    # half the step, so the mean does not hinge on the few phases simulated. The others' waits
    # follow from the first's (steps the burst itself started) and stay as simulated.
    overheads = [
        r.ttft - r.engine_ttft - (r.step_left - r.step_under_way / 2 if r.request_id.endswith("-0") else 0.0)
        for r in burst
        if r.ttft is not None and r.engine_ttft is not None
    ]
    return statistics.fmean(overheads)


def _modelled(
    base: StepTimeModel, config: EngineConfig, x: Sequence[float], points: Sequence[BurstPoint]
) -> list[float]:
    timing = base.with_frontend(*(max(0.0, v) * u for v, u in zip(x, _UNITS, strict=True)))
    return [simulated_overhead(timing, config, p) for p in points]


def fit_frontend(points: Sequence[BurstPoint], base: StepTimeModel, config: EngineConfig) -> FrontendFit:
    """The frontend coefficients (and constant) that best reproduce the measured overheads."""
    if len(points) < MIN_POINTS:
        raise CalibrationError("not enough burst probes to fit the frontend")
    base = dataclasses.replace(base.with_frontend(0.0, 0.0, 0.0), frontend_s=0.0)
    ys = [p.overhead for p in points]
    x = [0.5, 0.5, 0.5]
    const = 0.0
    for _ in range(_ITERATIONS):
        g = _modelled(base, config, x, points)
        cols = []
        for i in range(3):
            # Steps well above the granularity that the spread phases leave in the mean.
            h = max(0.5, 0.25 * x[i])
            shifted = list(x)
            shifted[i] += h
            cols.append(
                [(a - b) / h for a, b in zip(_modelled(base, config, shifted, points), g, strict=True)]
            )
        rows = [[1.0, *(col[j] for col in cols)] for j in range(len(points))]
        target = [
            y - gj + sum(col[j] * x[i] for i, col in enumerate(cols))
            for j, (y, gj) in enumerate(zip(ys, g, strict=True))
        ]
        try:
            const, *new = nonnegative_least_squares(rows, target)
        except CalibrationError:
            new = list(x)  # a coefficient no probe moves keeps its value
        moved = max(abs(a - b) for a, b in zip(new, x, strict=True))
        x = new
        if moved < 1e-3:
            break
    return FrontendFit(const, *(v * u for v, u in zip(x, _UNITS, strict=True)))


def modelled_overheads(
    timing: StepTimeModel, config: EngineConfig, points: Sequence[BurstPoint], round_trip: float
) -> list[float]:
    """What a fitted model gives each probe, round trip included: for the preset's report."""
    return [round_trip + simulated_overhead(timing, config, p) for p in points]
