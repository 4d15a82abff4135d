"""The burst probe of a running server's API frontend (fitted by `router.lab.sim.frontendfit`).

K streams decode; once each has produced a few tokens, bursts of N simultaneous requests of P
prompt tokens go out one after the other. The server's own histograms
(`vllm:request_queue_time_seconds`, `vllm:request_prefill_time_seconds`), read before and after
the bursts, say how long the engine core held the burst requests until their first token; the
client's time to first token minus that is the time spent outside the engine core.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import httpx

from router.lab.sim.frontendfit import (
    BACKGROUND_PROMPT,
    BACKGROUND_TOKENS,
    BURST_TOKENS,
    WARM_TOKENS,
    BurstPoint,
)
from router.lab.sim.lsq import CalibrationError
from router.lab.sim.timedstream import TimedStream

# (prompt tokens, output tokens, called at every token) -> the timed stream
StreamFn = Callable[[int, int, Callable[[float], None] | None], Coroutine[Any, Any, TimedStream]]

_ENGINE_HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")
_WARM_DEADLINE_S = 60.0
_SETTLE_DEADLINE_S = 5.0
_ATTEMPTS = 3


def engine_times(text: str) -> tuple[float, float] | None:
    """(requests counted, summed queue + prefill seconds) from a /metrics page; None when the
    server does not report both histograms or they count different requests."""
    sums = dict.fromkeys(_ENGINE_HISTOGRAMS, 0.0)
    counts = dict.fromkeys(_ENGINE_HISTOGRAMS, 0.0)
    seen: set[str] = set()
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if not rest:
            name = line.split(" ", 1)[0]
        for base in _ENGINE_HISTOGRAMS:
            if name == base + "_sum":
                sums[base] += float(line.rsplit(" ", 1)[1])
                seen.add(name)
            elif name == base + "_count":
                counts[base] += float(line.rsplit(" ", 1)[1])
                seen.add(name)
    if len(seen) < 2 * len(_ENGINE_HISTOGRAMS):
        return None
    queue, prefill = (counts[h] for h in _ENGINE_HISTOGRAMS)
    if queue != prefill:
        return None
    return queue, sum(sums.values())


async def scrape(client: httpx.AsyncClient) -> tuple[float, float] | None:
    r = await client.get("/metrics")
    return engine_times(r.text) if r.status_code == 200 else None


class BurstProber:
    """`background_tokens`: what each decoding stream asks for; they must outlast every burst
    of a probe, and a probe of 24 requests among 16 streams takes seconds on a small CPU."""

    def __init__(
        self, client: httpx.AsyncClient, stream: StreamFn, background_tokens: int = BACKGROUND_TOKENS
    ) -> None:
        self.client = client
        self.stream = stream
        self.background_tokens = background_tokens

    async def point(self, streams: int, burst: int, prompt: int, bursts: int) -> BurstPoint | None:
        """One probe; None when it cannot be read (the histograms did not count exactly the
        burst's requests, or a decoding stream ended before the bursts did)."""
        warm = [0] * streams
        ready = asyncio.Event()
        if streams == 0:
            ready.set()

        def counter(i: int) -> Callable[[float], None]:
            def on_token(_t: float) -> None:
                warm[i] += 1
                if warm[i] == WARM_TOKENS and all(n >= WARM_TOKENS for n in warm):
                    ready.set()

            return on_token

        background = [
            asyncio.create_task(self.stream(BACKGROUND_PROMPT, self.background_tokens, counter(i)))
            for i in range(streams)
        ]
        try:
            await asyncio.wait_for(ready.wait(), _WARM_DEADLINE_S)
            before = await scrape(self.client)
            if before is None:
                return None
            ttfts: list[float] = []
            for _ in range(bursts):
                results = await asyncio.gather(
                    *(self.stream(prompt, BURST_TOKENS, None) for _ in range(burst))
                )
                ttfts += [r.ttft for r in results]
            after = await self._settled(before[0] + len(ttfts))
            if after is None or any(task.done() for task in background):
                return None
        except TimeoutError as exc:
            raise CalibrationError("decoding streams of a burst probe did not start") from exc
        finally:
            for task in background:
                task.cancel()  # the server aborts a stream whose client went away
            await asyncio.gather(*background, return_exceptions=True)
        engine = (after[1] - before[1]) / (after[0] - before[0])
        return BurstPoint(streams, burst, prompt, statistics.fmean(ttfts) - engine)

    async def _settled(self, count: float) -> tuple[float, float] | None:
        """The histograms once they count every burst request (a server may record a finished
        request a moment after its last token went out)."""
        clock = asyncio.get_running_loop().time
        deadline = clock() + _SETTLE_DEADLINE_S
        while True:
            now = await scrape(self.client)
            if now is None or now[0] >= count:
                return now if now is not None and now[0] == count else None
            if clock() > deadline:
                return None
            await asyncio.sleep(0.05)

    async def round(
        self,
        points: Sequence[tuple[int, int, int]],
        into: dict[tuple[int, int, int], list[BurstPoint]],
        max_running: int | None,
    ) -> bool:
        """One round over every (streams, burst, prompt) probe; on a server that runs at most
        `max_running` requests at once, fewer decoding streams, so that the burst runs too.
        False when the server does not report the histograms the probe reads, so there is no
        frontend to fit."""
        if await scrape(self.client) is None:
            return False
        for wanted, burst, prompt in points:
            streams = wanted if max_running is None else min(wanted, max_running - burst)
            if streams < 0:
                continue
            # About 24 requests per probe: single requests in many bursts, big bursts in three.
            # An unreadable probe (a late-counted request, a decoding stream that ran out on a
            # slow host) is run again rather than left out: the fit needs every kind of point.
            for _ in range(_ATTEMPTS):
                point = await self.point(streams, burst, prompt, max(3, 24 // burst))
                if point is not None:
                    into.setdefault((streams, burst, prompt), []).append(point)
                    break
        return True


def median_point(points: Sequence[BurstPoint]) -> BurstPoint:
    first = points[0]
    return BurstPoint(first.streams, first.burst, first.prompt, statistics.median(p.overhead for p in points))
