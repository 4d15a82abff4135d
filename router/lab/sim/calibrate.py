"""Measure a running OpenAI-compatible server (a real vLLM), fit the step-time model, write a preset.

Probes, all streamed with `ignore_eos` and token-id prompts so lengths are exact on the server:

* decode: B concurrent streams with short prompts; while all B decode, every engine step yields
  one token per stream, so the gap between tokens is the step time of a batch of B
  (`router.lab.sim.decodewindow`: where that stretch is, and what a server whose `max_num_seqs` is
  below B gives instead);
* context: the same with long prompts, which separates the per-context-token cost;
* prefill: one request at a time with prompts of growing length and 2 output tokens; the time
  to the first token is round trip + frontend + one prefill step, whose attention part grows
  with the square of the prompt;
* frontend: bursts of simultaneous requests, alone and among decoding streams, timed by the
  client and by the server's own queue and prefill histograms (`router.lab.sim.frontendprobe`): the
  API server's cost per request, per prompt token and per output token.

Prompts are random ids, so no probe hits the prefix cache. A few plain-text requests measure how
many tokens the server's tokenizer makes of text the simulator counts at 4 characters a token.
The fit itself is in `router.lab.sim.fitting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import platform
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from router.lab.sim.config import EngineConfig
from router.lab.sim.decodewindow import decode_point
from router.lab.sim.fitting import CalibrationError, Measurements, fit, report
from router.lab.sim.frontendfit import BACKGROUND_PROMPT, BACKGROUND_TOKENS, BurstPoint
from router.lab.sim.frontendprobe import BurstProber, median_point
from router.lab.sim.timedstream import (
    KEEPALIVE_S,
    PauseDetector,
    StreamError,
    TimedStream,
    completion_body,
    timed_stream,
    token_prompt,
)
from router.lab.sim.timing import Preset
from router.request.tokens import estimate_text_tokens

_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "river", "stone", "cloud", "light", "ember",
          "north", "maple", "quartz", "violet", "harbor", "signal")  # fmt: skip


_ATTEMPTS = 3  # decode probe runs at most, when pauses of this process spoil them


@dataclass(frozen=True, slots=True)
class ProbePlan:
    batches: tuple[int, ...]
    decode_tokens: int
    short_prompt: int
    long_prompt: int
    context_batches: tuple[int, ...]
    prefill_prompts: tuple[int, ...]
    repeats: int  # prefill probes per size and round
    rounds: int
    # Burst probes of the API server: (decoding streams, burst size, prompt tokens).
    burst_points: tuple[tuple[int, int, int], ...] = ()

    @staticmethod
    def for_server(max_model_len: int, quick: bool) -> ProbePlan:
        # Long enough that a stretch remains in which every stream of a probe decodes, after
        # the server admitted the last of them (router.lab.sim.decodewindow).
        tokens = 64 if quick else 160
        long_prompt = min(2048, max_model_len // 2) - tokens
        # One prefill step each: stay within a 2,048-token step budget and the context.
        # Four sizes at least: the curve has a quadratic (attention) term besides the line.
        wanted = (16, 256, 1024, 1536) if quick else (16, 128, 512, 1024, 1536, 2000)
        sizes = tuple(p for p in wanted if p + 8 <= min(max_model_len, 2048))
        # Bursts alone (the admission's cost per request and per prompt token), then single
        # requests and a burst among decoding streams (the cost per output token).
        long_burst = max(64, min(1024, max_model_len // 2))
        burst_points = (
            ((0, 1, 32), (0, 1, long_burst), (0, 8, 32), (16, 1, 32))
            if quick
            else ((0, 1, 32), (0, 1, long_burst), (0, 4, 32), (0, 16, 32), (8, 1, 32), (16, 1, 32),
                  (32, 1, 32), (16, 8, 32))
        )  # fmt: skip
        return ProbePlan(
            batches=(1, 4, 16) if quick else (1, 2, 4, 8, 16, 32),
            decode_tokens=tokens,
            short_prompt=32,
            long_prompt=max(64, long_prompt),
            # Two batch sizes with long prompts: the context cost is per sequence and token.
            context_batches=(8,) if quick else (8, 16),
            prefill_prompts=sizes,
            repeats=3 if quick else 2,
            rounds=1 if quick else 3,
            burst_points=burst_points,
        )

    @property
    def decode_points(self) -> list[tuple[int, int]]:
        """(streams, prompt tokens) of every decode probe: short prompts at each batch size,
        then batches of long prompts for the per-context cost."""
        short = [(b, self.short_prompt) for b in self.batches]
        return short + [(b, self.long_prompt) for b in self.context_batches]


def probe_text(tokens: int, rng: random.Random) -> str:
    """About `tokens` simulator tokens (4 characters each) of plain text, led by a unique nonce."""
    words = [f"{rng.getrandbits(48):012x}"]
    length = len(words[0])
    while length < tokens * 4:
        words.append(rng.choice(_WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)[: tokens * 4]


class Prober:
    def __init__(
        self, client: httpx.AsyncClient, model: str, rng: random.Random, pauses: PauseDetector | None = None
    ) -> None:
        self.client = client
        self.model = model
        self.rng = rng
        self.pauses = pauses

    def clean(self, start: float, end: float) -> bool:
        """No pause of this process spoils the interval (both of its timestamps are true)."""
        return self.pauses is None or not self.pauses.spoils(start, end)

    async def stream(
        self, prompt_tokens: int, max_tokens: int, on_token: Callable[[float], None] | None = None
    ) -> TimedStream:
        body = completion_body(self.model, token_prompt(self.rng, prompt_tokens), max_tokens)
        try:
            return await timed_stream(self.client, body, on_token)
        except StreamError as exc:
            raise CalibrationError(f"probe failed: {exc}") from exc

    async def decode_point(self, batch: int, prompt: int, tokens: int) -> tuple[int, int, float, float]:
        """One decode probe; run again (at most twice) while pauses of this process spoil most
        of it, since they also hide which streams ran together."""
        skip = min(4, tokens // 4)
        for _ in range(_ATTEMPTS):
            results = await asyncio.gather(*(self.stream(prompt, tokens) for _ in range(batch)))
            point = decode_point(results, skip, self.clean)
            if point is not None:
                break
        else:
            point = decode_point(results, skip)  # every run was spoiled: the last one as it is
        if point is None:
            raise CalibrationError("decode probe too short to measure gaps")
        return batch, point.ran, point.context, point.step

    async def text_ratio(self, sizes: Sequence[int]) -> float:
        """Server prompt tokens per simulator token, over plain-text prompts."""
        ratios = []
        for size in sizes:
            text = probe_text(size, self.rng)
            body = {"model": self.model, "prompt": text, "max_tokens": 1}
            r = await self.client.post("/v1/completions", json=body)
            if r.status_code == 200:
                ratios.append(r.json()["usage"]["prompt_tokens"] / estimate_text_tokens(text))
        return statistics.median(ratios) if ratios else 1.0


async def measure(
    url: str, *, api_key: str | None = None, model: str | None = None, quick: bool = False, seed: int = 0
) -> Measurements:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                base_url=url.rstrip("/"),
                headers=headers,
                timeout=300,
                limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
            )
        )
        m = await _server_facts(client, model)
        plan = ProbePlan.for_server(m.max_model_len, quick)
        pauses = await stack.enter_async_context(PauseDetector())
        prober = Prober(client, m.model, random.Random(seed), pauses)
        await prober.stream(plan.short_prompt, 4)  # warm-up, not measured
        # Every probe is repeated in rounds over all sizes, not back to back: a burst of load
        # from elsewhere on a shared host then spoils one sample of many sizes, which the
        # median removes, instead of every sample of one size, which would tilt the fit.
        trips: list[float] = []
        decode: dict[tuple[int, int], list[tuple[int, int, float, float]]] = {}
        prefill: dict[int, list[TimedStream]] = {}
        bursts: dict[tuple[int, int, int], list[BurstPoint]] = {}
        background = min(4 * BACKGROUND_TOKENS, m.max_model_len - BACKGROUND_PROMPT - 8)
        burst_prober: BurstProber | None = BurstProber(client, prober.stream, background)
        for _ in range(plan.rounds):
            trips += await _round_trips(client, 3)
            for batch, prompt in plan.decode_points:
                point = await prober.decode_point(batch, prompt, plan.decode_tokens)
                decode.setdefault((batch, prompt), []).append(point)
            for _ in range(plan.repeats):
                for size in plan.prefill_prompts:
                    prefill.setdefault(size, []).append(await prober.stream(size, 2))
            # A server that ran fewer decode streams at once than were sent has that limit.
            ran = [(p[0], p[1]) for points in decode.values() for p in points]
            limit = max(r for _, r in ran) if any(r < sent for sent, r in ran) else None
            if burst_prober is not None and not await burst_prober.round(plan.burst_points, bursts, limit):
                burst_prober = None
        m.round_trip = statistics.median(trips)
        m.decode = [_median_point(points) for points in decode.values()]
        for runs in prefill.values():
            clean = [r for r in runs if prober.clean(r.start, r.token_times[0])] or runs
            m.prefill.append((runs[0].prompt_tokens, statistics.median(r.ttft for r in clean)))
        m.bursts = [median_point(points) for points in bursts.values()]
        m.token_ratio = await prober.text_ratio((64, 256) if quick else (64, 256, 512))
    return m


def _median_point(points: Sequence[tuple[int, int, float, float]]) -> tuple[int, int, float, float]:
    """One decode probe point from its rounds: the median step, the largest batch seen."""
    sent, _, ctx, _ = points[0]
    return sent, max(p[1] for p in points), ctx, statistics.median(p[3] for p in points)


async def _round_trips(client: httpx.AsyncClient, n: int) -> list[float]:
    """HTTP and client overhead that the simulator's own server adds back when it replays."""
    clock = asyncio.get_running_loop().time
    samples = []
    for _ in range(n):
        start = clock()
        (await client.get("/v1/models")).raise_for_status()
        samples.append(clock() - start)
    return samples


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
        m.num_gpu_blocks, m.block_size = cache_config(metrics.text)
    return m


def cache_config(text: str) -> tuple[int | None, int | None]:
    """num_gpu_blocks and block_size from `vllm:cache_config_info`."""
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


def to_preset(
    m: Measurements, *, name: str, url: str, stamp: str, engine_flags: Mapping[str, Any] | None = None
) -> Preset:
    """`engine_flags`: scheduler settings the server was started with, which no probe sees
    (e.g. max_num_seqs); they override what calibration would assume."""
    engine: dict[str, Any] = {"max_model_len": m.max_model_len}
    if m.version:
        engine["version"] = m.version
    if m.block_size:
        engine["block_size"] = m.block_size
    engine["num_gpu_blocks"] = m.num_gpu_blocks or EngineConfig().num_gpu_blocks
    engine["max_num_batched_tokens"] = max(EngineConfig().max_num_batched_tokens, m.max_model_len)
    engine.update(engine_flags or {})
    config = EngineConfig.from_mapping(engine)
    return Preset(
        name=name,
        description=f"calibrated against {m.model} at {url} on {stamp}",
        model=m.model,
        timing=fit(m, config),
        engine=config,
    )


def host_description() -> str:
    """CPU model, core count and vector extensions: what the fitted numbers depend on."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    cores = len(os.sched_getaffinity(0))
    return f"{model}, {cores} cores, {vector}"


def header(
    m: Measurements, preset: Preset, *, url: str, stamp: str, command: str, notes: Sequence[str]
) -> str:
    lines = [
        f"{preset.name}: {m.model} (vLLM {m.version or '?'}) measured at {url} on {stamp}",
        f"host: {host_description()}",
        f"command: {command}",
        *notes,
        *report(m, preset.timing, preset.engine),
    ]
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


async def calibrate_to_file(
    url: str,
    out: Path,
    *,
    api_key: str | None = None,
    model: str | None = None,
    name: str = "calibrated",
    quick: bool = False,
    command: str = "lane-router sim calibrate",
    notes: Sequence[str] = (),
    engine_flags: Mapping[str, Any] | None = None,
) -> Preset:
    m = await measure(url, api_key=api_key, model=model, quick=quick)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    preset = to_preset(m, name=name, url=url, stamp=stamp, engine_flags=engine_flags)
    text = header(m, preset, url=url, stamp=stamp, command=command, notes=notes) + preset.to_yaml()
    await asyncio.to_thread(out.write_text, text)
    return preset
