"""One streamed completion timed by the client: what calibration and the faithfulness check see.

Prompts are token ids, not text. The simulator has no tokenizer (it counts 4 characters a token)
while a real server counts with its model's tokenizer, so the same text is a different number of
tokens on each side; token ids are the same length everywhere and keep prefix sharing exact.

Requests ask for `return_token_ids`, so vLLM puts every output token in its own event (without
it, tokens that end inside a multi-byte character are held back and merged into the next event,
which would hide a gap). The simulator ignores the flag and sends one event a token anyway.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx
import orjson

# Drawn below 2000 so any vocabulary holds them (the tiny test model has 2,048 ids).
FIRST_ID, LAST_ID = 3, 2000
# Idle connections are dropped well before uvicorn's 5 s keep-alive (vLLM's server) closes them:
# reusing one the server is closing at that moment fails the request with a read error.
KEEPALIVE_S = 2.0


class StreamError(RuntimeError):
    """A probe or workload request failed or produced no tokens."""


@dataclass(frozen=True, slots=True)
class TimedStream:
    start: float
    token_times: list[float]  # arrival of every output token, in order
    prompt_tokens: int  # as the server counted the prompt (its usage report)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.start

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]

    @property
    def end(self) -> float:
        return self.token_times[-1]


def token_prompt(rng: random.Random, length: int) -> list[int]:
    """`length` random token ids: a fresh prompt shares no KV block with any other."""
    return [rng.randrange(FIRST_ID, LAST_ID) for _ in range(length)]


def completion_body(model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """A streamed completion of exactly `max_tokens` tokens (greedy, end-of-sequence ignored)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


def _event_tokens(choice: Mapping[str, Any]) -> int:
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return len(ids)
    return 1 if choice.get("text") else 0


async def timed_stream(
    client: httpx.AsyncClient, body: Mapping[str, Any], on_token: Callable[[float], None] | None = None
) -> TimedStream:
    """Send `body` and time every token; `on_token` sees each arrival as it happens, so a caller
    can follow a stream's progress while it runs."""
    clock = asyncio.get_running_loop().time  # the loop's clock: virtual on a VirtualTimeLoop
    start = clock()
    times: list[float] = []
    prompt_tokens = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise StreamError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = orjson.loads(line[6:])
                now = clock()
                for choice in event.get("choices") or ():
                    for _ in range(_event_tokens(choice)):
                        times.append(now)
                        if on_token is not None:
                            on_token(now)
                usage = event.get("usage")
                if usage:
                    prompt_tokens = int(usage.get("prompt_tokens", prompt_tokens))
    except httpx.TransportError as exc:
        raise StreamError(f"{type(exc).__name__}: {exc}") from exc
    if not times:
        raise StreamError("a stream produced no tokens")
    return TimedStream(start, times, prompt_tokens)


async def served_model(client: httpx.AsyncClient) -> tuple[str, int]:
    """The first served model's name and context length."""
    try:
        data = (await client.get("/v1/models")).raise_for_status().json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise StreamError(f"cannot list models: {exc}") from exc
    return str(data["id"]), int(data.get("max_model_len") or 2048)


async def prefix_counters(client: httpx.AsyncClient) -> tuple[float, float]:
    """`vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total`, summed over engines."""
    hits = queries = 0.0
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


@dataclass(slots=True)
class PauseDetector:
    """Notices when the measuring process itself stops running.

    A tick every `tick` seconds; a tick that comes back more than `threshold` late means this
    process (or the whole machine) did not run meanwhile. A timestamp taken during such a pause,
    or while the process catches up just after it (`settle`), may be late: whatever it marks
    (a token's arrival) may have happened earlier. A sample (a TTFT, one token gap) is only as
    good as its two timestamps, so it is spoiled when either may be late, or when a pause began
    right after its start (the request it times went out late). A sample that merely contains a
    pause is not: its end was read when the token came, and leaving such samples out would drop
    long ones (which contain more pauses) far more often than short ones, biasing every
    percentile low on a busy host.
    """

    tick: float = 0.005
    threshold: float = 0.02
    settle: float = 0.01
    pauses: list[tuple[float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PauseDetector:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        clock = asyncio.get_running_loop().time
        while True:
            before = clock()
            await asyncio.sleep(self.tick)
            after = clock()
            if after - before - self.tick > self.threshold:
                self.pauses.append((before + self.tick, after))

    def late(self, t: float) -> bool:
        """Whether a timestamp taken at `t` may be late: during a pause or just after one."""
        return any(a < t < b + self.settle for a, b in self.pauses)

    def spoils(self, start: float, end: float) -> bool:
        """Whether the interval between two timestamps of this process may be wrong."""
        delayed_start = any(start <= a < start + self.settle for a, _ in self.pauses)
        return delayed_start or self.late(start) or self.late(end)
