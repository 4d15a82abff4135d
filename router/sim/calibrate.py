"""Fit the step-time model to a running OpenAI-compatible server (a real vLLM) and write a preset.

Probes, all streamed with `ignore_eos` so output lengths are exact:

* decode: B concurrent streams with short prompts; in steady state every engine step yields one
  token per stream, so the median gap between chunks is the step time at batch B;
* context: the same with long prompts, which separates the per-context-token cost;
* prefill: one request at a time with prompts of growing length and 2 output tokens; the time
  to the first token is frontend + one prefill step.

Fit: step(B, ctx) = c0 + c_decode·B + c_ctx·B·ctx by least squares on the decode and context
probes; then TTFT(P) = (frontend + c0) + (c_prefill + c_ctx)·P on the prefill probes. Prompts
start with a random nonce so no probe hits the prefix cache.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from router.sim.config import EngineConfig
from router.sim.timing import Preset, StepTimeModel
from router.tokens import estimate_text_tokens

_WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "omega",
    "river",
    "stone",
    "cloud",
    "light",
    "ember",
    "north",
    "maple",
    "quartz",
    "violet",
    "harbor",
    "signal",
)


class CalibrationError(RuntimeError):
    """The server could not be probed or the probes do not determine the model."""


@dataclass(frozen=True, slots=True)
class StreamTiming:
    ttft: float
    gaps: list[float]
    prompt_tokens: int  # as the simulator counts the probe text (what a replay will see)
    server_prompt_tokens: int  # as the probed server's tokenizer counted it


@dataclass(slots=True)
class Measurements:
    model: str
    max_model_len: int
    version: str | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    decode: list[tuple[int, float, float]] = field(default_factory=list)  # (B, mean ctx, step s)
    # Server tokens per simulator token on the probe texts: the fit is expressed per simulator
    # token (≈4 characters), so that replaying the same text reproduces the same time.
    token_ratio: float = 1.0
    prefill: list[tuple[int, float]] = field(default_factory=list)  # (prompt tokens, ttft s)
    round_trip: float = 0.0  # an idle request/response without generation, seconds


@dataclass(frozen=True, slots=True)
class ProbePlan:
    batches: tuple[int, ...]
    decode_tokens: int
    short_prompt: int
    long_prompt: int
    context_batch: int
    prefill_prompts: tuple[int, ...]
    repeats: int

    @staticmethod
    def for_server(max_model_len: int, quick: bool) -> ProbePlan:
        tokens = 24 if quick else 96
        long_prompt = min(2048, max_model_len // 2) - tokens
        sizes = [p for p in (16, 256, 1024, 2048, 4096) if p + 8 <= max_model_len // 2]
        return ProbePlan(
            batches=(1, 4, 16) if quick else (1, 2, 4, 8, 16, 32),
            decode_tokens=tokens,
            short_prompt=32,
            long_prompt=max(64, long_prompt),
            context_batch=8,
            prefill_prompts=tuple(sizes[:3] if quick else sizes),
            repeats=3 if quick else 5,
        )


def probe_text(tokens: int, rng: random.Random) -> str:
    """About `tokens` tokens of text (≈4 characters each), led by a unique nonce."""
    words = [f"{rng.getrandbits(48):012x}"]
    length = len(words[0])
    while length < tokens * 4:
        words.append(rng.choice(_WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)[: tokens * 4]


class Prober:
    def __init__(self, client: httpx.AsyncClient, model: str, rng: random.Random) -> None:
        self.client = client
        self.model = model
        self.rng = rng

    async def stream(self, prompt_tokens: int, max_tokens: int) -> StreamTiming:
        text = probe_text(prompt_tokens, self.rng)
        body = {
            "model": self.model,
            "prompt": text,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        start = time.perf_counter()
        times: list[float] = []
        reported = prompt_tokens
        async with self.client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise CalibrationError(f"probe got HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = orjson.loads(line[6:])
                if event.get("choices") and event["choices"][0].get("text"):
                    times.append(time.perf_counter())
                usage = event.get("usage")
                if usage:
                    reported = int(usage.get("prompt_tokens", reported))
        if not times:
            raise CalibrationError("a probe stream produced no text")
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return StreamTiming(times[0] - start, gaps, estimate_text_tokens(text), reported)


async def _decode_point(prober: Prober, batch: int, prompt: int, tokens: int) -> tuple[int, float, float]:
    results = await asyncio.gather(*(prober.stream(prompt, tokens) for _ in range(batch)))
    # Skip each stream's first gaps: the batch is still filling while other prompts prefill.
    skip = min(4, tokens // 4)
    gaps = [g for r in results for g in r.gaps[skip:]]
    if not gaps:
        raise CalibrationError("decode probe too short to measure gaps")
    ctx = statistics.mean(r.prompt_tokens for r in results) + tokens / 2
    return batch, ctx, statistics.median(gaps)


async def measure(
    url: str, *, api_key: str | None = None, model: str | None = None, quick: bool = False, seed: int = 0
) -> Measurements:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=300) as client:
        m = await _server_facts(client, model)
        plan = ProbePlan.for_server(m.max_model_len, quick)
        prober = Prober(client, m.model, random.Random(seed))
        await prober.stream(plan.short_prompt, 4)  # warm-up, not measured
        m.round_trip = await _round_trip(client)
        for batch in plan.batches:
            m.decode.append(await _decode_point(prober, batch, plan.short_prompt, plan.decode_tokens))
        m.decode.append(await _decode_point(prober, plan.context_batch, plan.long_prompt, plan.decode_tokens))
        ratios = []
        for size in plan.prefill_prompts:
            runs = [await prober.stream(size, 2) for _ in range(plan.repeats)]
            # The median of repeats: one slow outlier (a busy client) must not tilt the line.
            m.prefill.append((runs[0].prompt_tokens, statistics.median(r.ttft for r in runs)))
            ratios += [r.server_prompt_tokens / r.prompt_tokens for r in runs]
        m.token_ratio = statistics.median(ratios)
    return m


async def _round_trip(client: httpx.AsyncClient) -> float:
    """HTTP and client overhead that the simulator's own server adds back when it replays."""
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        (await client.get("/v1/models")).raise_for_status()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def _server_facts(client: httpx.AsyncClient, model: str | None) -> Measurements:
    try:
        models = (await client.get("/v1/models")).raise_for_status().json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise CalibrationError(f"cannot list models: {exc}") from exc
    chosen = next((d for d in models if d["id"] == model), None) if model else models[0]
    if chosen is None:
        raise CalibrationError(f"model {model!r} is not served")
    m = Measurements(model=chosen["id"], max_model_len=int(chosen.get("max_model_len") or 2048))
    version = await client.get("/version")
    if version.status_code == 200:
        m.version = version.json().get("version")
    metrics = await client.get("/metrics")
    if metrics.status_code == 200:
        m.num_gpu_blocks, m.block_size = _cache_config(metrics.text)
    return m


def _cache_config(text: str) -> tuple[int | None, int | None]:
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
                if "=" in part
            )
            blocks = labels.get("num_gpu_blocks", "").strip('"')
            size = labels.get("block_size", "").strip('"')
            return (int(blocks) if blocks.isdigit() else None, int(size) if size.isdigit() else None)
    return None, None


# ---- fitting ---------------------------------------------------------------------------------
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
    rows = [[1.0, float(b), b * ctx] for b, ctx, _ in m.decode]
    c0, c_decode, c_ctx = nonnegative_least_squares(rows, [t for _, _, t in m.decode])
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


def to_preset(m: Measurements, timing: StepTimeModel, *, name: str, url: str) -> Preset:
    engine: dict[str, Any] = {"max_model_len": m.max_model_len}
    if m.version:
        engine["version"] = m.version
    if m.block_size:
        engine["block_size"] = m.block_size
    engine["num_gpu_blocks"] = m.num_gpu_blocks or EngineConfig().num_gpu_blocks
    engine["max_num_batched_tokens"] = max(EngineConfig().max_num_batched_tokens, m.max_model_len)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Preset(
        name=name,
        description=f"calibrated against {m.model} at {url} on {stamp}",
        model=m.model,
        timing=timing,
        engine=EngineConfig.from_mapping(engine),
    )


def report(m: Measurements, timing: StepTimeModel) -> str:
    """The probe points beside the fitted model's predictions, as YAML comments."""
    lines = ["# decode probes: batch, mean context, measured step ms, model step ms"]
    for b, ctx, t in m.decode:
        model = timing.step_time(0, b, round(b * ctx))
        lines.append(f"#   {b:4d} {ctx:8.0f} {t * 1e3:9.3f} {model * 1e3:9.3f}")
    lines.append(f"# idle HTTP round trip: {m.round_trip * 1e3:.3f} ms (not part of frontend_s)")
    lines.append(f"# server tokens per simulator token on the probe texts: {m.token_ratio:.3f}")
    lines.append("# prefill probes: prompt tokens, measured TTFT ms, model TTFT ms (with round trip)")
    for p, t in m.prefill:
        model = m.round_trip + timing.frontend_s + timing.step_time(p, 0, p)
        lines.append(f"#   {p:6d} {t * 1e3:9.3f} {model * 1e3:9.3f}")
    return "\n".join(lines) + "\n"


async def calibrate_to_file(
    url: str,
    out: Path,
    *,
    api_key: str | None = None,
    model: str | None = None,
    name: str = "calibrated",
    quick: bool = False,
) -> Preset:
    m = await measure(url, api_key=api_key, model=model, quick=quick)
    timing = fit(m)
    preset = to_preset(m, timing, name=name, url=url)
    await asyncio.to_thread(out.write_text, report(m, timing) + preset.to_yaml())
    return preset
