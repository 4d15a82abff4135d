"""Faithfulness check: the same short mixed workload against a real vLLM and the simulator.

The workload (seeded) mixes short chats, RAG questions over a few shared documents and long
prompts, sent with bounded concurrency and `ignore_eos` so both servers do the same work. Each
side reports TTFT and ITL (p50, p95, measured by the client) and the prefix-cache hit rate
(from the server's own `vllm:prefix_cache_*` counters). The simulator passes when every latency
is within `latency_tolerance` (relative) of the real one and the hit rate within
`hit_rate_points` percentage points.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson


@dataclass(frozen=True, slots=True)
class Observed:
    ttft_p50: float
    ttft_p95: float
    itl_p50: float
    itl_p95: float
    hit_rate: float
    requests: int


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    real: float
    sim: float
    ok: bool


def mixed_workload(n: int, *, seed: int = 0, max_model_len: int = 2048) -> list[dict[str, Any]]:
    """`n` completion bodies; prompts stay within half the context."""
    rng = random.Random(seed)
    words = ("engine", "block", "prefix", "token", "stream", "cache", "batch", "queue", "model")
    budget = max_model_len // 2

    def text(tokens: int) -> str:
        return " ".join(rng.choice(words) for _ in range(tokens))[: tokens * 4]

    docs = [text(min(600, budget - 80)) for _ in range(3)]
    bodies = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            prompt, out = f"{i} " + text(rng.randint(40, min(300, budget))), rng.randint(24, 64)
        elif kind == 1:
            prompt, out = rng.choice(docs) + f" question {i}: " + text(20), 16
        else:
            prompt, out = f"{i} " + text(min(1200, budget)), 8
        bodies.append(
            {
                "prompt": prompt,
                "max_tokens": out,
                "min_tokens": out,
                "ignore_eos": True,
                "stream": True,
                "temperature": 0.0,
            }
        )
    return bodies


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _prefix_counters(client: httpx.AsyncClient) -> tuple[float, float]:
    hits = queries = 0.0
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def _one(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, list[float]]:
    start = time.perf_counter()
    times: list[float] = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                event = orjson.loads(line[6:])
                if event.get("choices") and event["choices"][0].get("text"):
                    times.append(time.perf_counter())
    if not times:
        raise RuntimeError("a stream produced no text")
    return times[0] - start, [b - a for a, b in itertools.pairwise(times)]


async def run_workload(
    url: str,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int = 4,
    api_key: str | None = None,
    model: str | None = None,
) -> Observed:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=300) as client:
        if model is None:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
        hits0, queries0 = await _prefix_counters(client)
        gate = asyncio.Semaphore(concurrency)

        async def limited(body: dict[str, Any]) -> tuple[float, list[float]]:
            async with gate:
                return await _one(client, {**body, "model": model})

        results = await asyncio.gather(*(limited(b) for b in bodies))
        hits1, queries1 = await _prefix_counters(client)
    ttfts = [r[0] for r in results]
    itls = [g for r in results for g in r[1]]
    queries = queries1 - queries0
    return Observed(
        ttft_p50=statistics.median(ttfts),
        ttft_p95=_percentile(ttfts, 0.95),
        itl_p50=statistics.median(itls),
        itl_p95=_percentile(itls, 0.95),
        hit_rate=(hits1 - hits0) / queries if queries else 0.0,
        requests=len(results),
    )


def compare(
    real: Observed, sim: Observed, *, latency_tolerance: float = 0.25, hit_rate_points: float = 10.0
) -> list[Check]:
    checks = []
    for name in ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95"):
        r, s = getattr(real, name), getattr(sim, name)
        checks.append(Check(name, r, s, abs(s - r) <= latency_tolerance * r))
    checks.append(
        Check(
            "hit_rate",
            real.hit_rate,
            sim.hit_rate,
            abs(sim.hit_rate - real.hit_rate) * 100 <= hit_rate_points,
        )
    )
    return checks


def format_checks(checks: Sequence[Check]) -> str:
    lines = [f"{'metric':10} {'real':>10} {'sim':>10}  result"]
    for c in checks:
        unit = 1.0 if c.name == "hit_rate" else 1e3
        lines.append(
            f"{c.name:10} {c.real * unit:10.3f} {c.sim * unit:10.3f}  {'ok' if c.ok else 'OUT OF TOLERANCE'}"
        )
    return "\n".join(lines)
