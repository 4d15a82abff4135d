"""Faithfulness check: the same workload against a real vLLM and the simulator, side by side.

Two seeded workloads, sent with bounded concurrency, token-id prompts and `ignore_eos` so both
servers do exactly the same work:

* `latency` — independent requests, prompts 50–1,500 tokens and outputs 16–256 (both
  log-uniform), no shared prefixes. Each side reports TTFT and ITL (p50, p95) as the client sees
  them; each concurrency level gets its own prompts, so a level never hits blocks cached by an
  earlier one;
* `prefix` — a few documents, each asked several questions in shuffled order; each side reports
  its prefix-cache hit rate from its own `vllm:prefix_cache_*` counters (deltas over the run).

The two servers run one level after the other (real, then simulator) so that both see about the
same machine; the 1-minute load average at each level is reported with it. Latency samples whose
timestamps a pause of the measuring process itself may have delayed (`PauseDetector`) are left
out on both sides, and the share left out is reported.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
import secrets
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from router.lab.sim.timedstream import (
    KEEPALIVE_S,
    PauseDetector,
    TimedStream,
    completion_body,
    prefix_counters,
    served_model,
    timed_stream,
    token_prompt,
)

LATENCY_METRICS = ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95")


@dataclass(frozen=True, slots=True)
class Job:
    prompt: list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Observed:
    ttft_p50: float
    ttft_p95: float
    itl_p50: float
    itl_p95: float
    hit_rate: float
    requests: int
    dropped: float = 0.0  # share of latency samples left out: timestamps a client pause delayed


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    real: float
    sim: float
    ok: bool

    @property
    def error(self) -> float:
        """Relative error for latencies; difference in percentage points for the hit rate."""
        if self.name == "hit_rate":
            return (self.sim - self.real) * 100
        return (self.sim - self.real) / self.real if self.real else math.inf


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def latency_workload(
    n: int,
    *,
    seed: int = 0,
    salt: int = 0,
    prompt: tuple[int, int] = (50, 1500),
    output: tuple[int, int] = (16, 256),
) -> list[Job]:
    """`n` independent requests. `seed` draws the lengths; `salt` with it draws the token ids, so
    a new salt gives the same shape of work in prompts no server has cached yet."""
    rng, ids = random.Random(seed), random.Random(f"{seed}:{salt}")
    lengths = [(_log_uniform(rng, *prompt), _log_uniform(rng, *output)) for _ in range(n)]
    return [Job(token_prompt(ids, p), out) for p, out in lengths]


def prefix_workload(
    docs: int = 5,
    questions: int = 6,
    *,
    seed: int = 0,
    salt: int = 0,
    doc_tokens: tuple[int, int] = (400, 1400),
    question_tokens: tuple[int, int] = (20, 80),
    output: int = 16,
) -> list[Job]:
    """`docs` documents × `questions` questions each, shuffled (`seed`, `salt` as above)."""
    rng, ids = random.Random(seed), random.Random(f"{seed}:{salt}")
    texts = [token_prompt(ids, rng.randint(*doc_tokens)) for _ in range(docs)]
    jobs = [
        Job(doc + token_prompt(ids, rng.randint(*question_tokens)), output)
        for doc in texts
        for _ in range(questions)
    ]
    rng.shuffle(jobs)
    return jobs


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def summarize(
    streams: Sequence[TimedStream], hit_rate: float, pauses: PauseDetector | None = None
) -> Observed:
    def clean(a: float, b: float) -> bool:
        return pauses is None or not pauses.spoils(a, b)

    all_ttfts = [(s.start, s.token_times[0]) for s in streams]
    all_gaps = [pair for s in streams for pair in itertools.pairwise(s.token_times)]
    ttfts = [b - a for a, b in all_ttfts if clean(a, b)] or [b - a for a, b in all_ttfts]
    itls = [b - a for a, b in all_gaps if clean(a, b)] or [b - a for a, b in all_gaps]
    samples = len(all_ttfts) + len(all_gaps)
    return Observed(
        ttft_p50=statistics.median(ttfts),
        ttft_p95=percentile(ttfts, 0.95),
        itl_p50=statistics.median(itls) if itls else 0.0,
        itl_p95=percentile(itls, 0.95) if itls else 0.0,
        hit_rate=hit_rate,
        requests=len(streams),
        dropped=1 - (len(ttfts) + len(itls)) / samples,
    )


async def run_workload(
    url: str, jobs: Sequence[Job], *, concurrency: int = 4, api_key: str | None = None
) -> Observed:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 2, keepalive_expiry=KEEPALIVE_S)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, timeout=300, limits=limits
    ) as client:
        model, _ = await served_model(client)
        hits0, queries0 = await prefix_counters(client)
        gate = asyncio.Semaphore(concurrency)

        async def limited(job: Job) -> TimedStream:
            async with gate:
                return await timed_stream(client, completion_body(model, job.prompt, job.max_tokens))

        async with PauseDetector() as pauses:
            streams = await asyncio.gather(*(limited(j) for j in jobs))
        hits1, queries1 = await prefix_counters(client)
    queries = queries1 - queries0
    return summarize(streams, (hits1 - hits0) / queries if queries else 0.0, pauses)


def compare(
    real: Observed,
    sim: Observed,
    *,
    latency_tolerance: float = 0.25,
    hit_rate_points: float = 10.0,
    metrics: Sequence[str] = (*LATENCY_METRICS, "hit_rate"),
) -> list[Check]:
    checks = []
    for name in metrics:
        r, s = getattr(real, name), getattr(sim, name)
        if name == "hit_rate":
            ok = abs(s - r) * 100 <= hit_rate_points
        else:
            ok = abs(s - r) <= latency_tolerance * r
        checks.append(Check(name, r, s, ok))
    return checks


def format_checks(checks: Sequence[Check]) -> str:
    lines = [f"{'metric':10} {'real':>10} {'sim':>10} {'error':>8}  result"]
    for c in checks:
        if c.name == "hit_rate":
            values, err = f"{c.real * 100:9.1f}% {c.sim * 100:9.1f}%", f"{c.error:+6.1f}pt"
        else:
            values, err = f"{c.real * 1e3:8.2f}ms {c.sim * 1e3:8.2f}ms", f"{c.error * 100:+6.0f}%"
        lines.append(f"{c.name:10} {values} {err:>8}  {'ok' if c.ok else 'OUT OF TOLERANCE'}")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Level:
    concurrency: int
    load: float  # 1-minute load average when the level started
    checks: list[Check]
    dropped: tuple[float, float] = (0.0, 0.0)  # real, sim: share of samples left out


async def compare_levels(
    real_url: str,
    sim_url: str,
    *,
    workload: str,
    levels: Sequence[int],
    requests: int,
    seed: int = 0,
    salt: int | None = None,
    real_api_key: str | None = None,
    sim_api_key: str | None = None,
    latency_tolerance: float = 0.25,
    hit_rate_points: float = 10.0,
) -> list[Level]:
    """Each level in turn, real first. Without a `salt`, prompts are fresh for this run: a real
    server that served an earlier run keeps its prompts in its prefix cache, a restarted
    simulator does not, and the two would no longer do the same work."""
    salt = secrets.randbits(32) if salt is None else salt
    out = []
    for i, concurrency in enumerate(levels):
        if workload == "prefix":
            jobs = prefix_workload(questions=max(2, requests // 5), seed=seed + i, salt=salt)
            metrics: tuple[str, ...] = ("hit_rate",)
        else:
            jobs = latency_workload(requests, seed=seed + i, salt=salt)
            metrics = LATENCY_METRICS
        load = os.getloadavg()[0]
        real = await run_workload(real_url, jobs, concurrency=concurrency, api_key=real_api_key)
        sim = await run_workload(sim_url, jobs, concurrency=concurrency, api_key=sim_api_key)
        checks = compare(
            real, sim, latency_tolerance=latency_tolerance, hit_rate_points=hit_rate_points, metrics=metrics
        )
        out.append(Level(concurrency, load, checks, (real.dropped, sim.dropped)))
    return out


def format_levels(levels: Sequence[Level]) -> str:
    """A Markdown table: one row per concurrency level, real / sim / error for each metric."""
    names = [c.name for c in levels[0].checks]
    head = "| conc | load | " + " | ".join(f"{n} real | sim | err" for n in names) + " | left out |"
    rule = "|" + "---|" * (3 + 3 * len(names))
    rows = [head, rule]
    for level in levels:
        cells = [str(level.concurrency), f"{level.load:.1f}"]
        for c in level.checks:
            if c.name == "hit_rate":
                mark = "" if c.ok else " ✗"
                cells += [f"{c.real * 100:.1f}%", f"{c.sim * 100:.1f}%", f"{c.error:+.1f} pt{mark}"]
            else:
                mark = "" if c.ok else " ✗"
                cells += [f"{c.real * 1e3:.1f}", f"{c.sim * 1e3:.1f}", f"{c.error * 100:+.0f}%{mark}"]
        cells.append(f"{level.dropped[0] * 100:.0f}% / {level.dropped[1] * 100:.0f}%")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
