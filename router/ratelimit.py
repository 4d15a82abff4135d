"""Per-key rate limits: requests per minute, tokens per minute, concurrent requests.

Requests and tokens are token buckets that refill continuously (a full minute's allowance at
most), so a key may burst up to its per-minute limit and is then paced. A request's tokens are
charged up front at their upper bound — the prompt estimate plus the output bound the backend
receives, times its sequences (router.rewrite writes a bound into every request) — and
corrected when the response reports its real usage. A refused request takes nothing:
every limit is checked before any is charged.

The limiter itself is pure: `refill`, `judge`, `charge`, `settled` and `refunded` compute from a
key's `Levels` (what is left of each bucket and the requests in flight). Where the levels live is
the `RateStore`'s business: `MemoryRateStore` serves one router process; the Redis store of
`router.redisstores` keeps one set of levels for several replicas, updated by atomic scripts
that do the same arithmetic, and hands the levels it found back to `judge`.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple, Protocol

from router.errors import RateLimited

# A bucket refills from empty to full in one minute.
REFILL_S = 60.0


# Limits, levels and verdicts are named tuples: immutable values that cost a request no more
# than a tuple each, which the request path makes several of.
class Limits(NamedTuple):
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrency is not None


class Verdict(NamedTuple):
    allowed: bool
    reason: str = ""  # requests | tokens | concurrency | too_large when refused
    retry_after_s: float = 0.0
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    # The store charged this request: it must be settled or refunded. False when a shared store
    # could not be reached and its policy let the request through uncounted.
    recorded: bool = True


class Levels(NamedTuple):
    """One key's buckets: requests and tokens left (tokens may be negative after an
    underestimate), and its requests in flight."""

    requests: float
    tokens: float
    in_flight: int = 0

    @classmethod
    def full(cls, limits: Limits) -> Levels:
        return cls(float(limits.rpm or 0), float(limits.tpm or 0))


def refill(levels: Levels, limits: Limits, elapsed_s: float) -> Levels:
    elapsed = elapsed_s if elapsed_s > 0.0 else 0.0
    requests, tokens = levels.requests, levels.tokens
    rpm, tpm = limits.rpm, limits.tpm
    if rpm is not None:
        requests += elapsed * rpm / REFILL_S
        if requests > rpm:
            requests = float(rpm)
    if tpm is not None:
        tokens += elapsed * tpm / REFILL_S
        if tokens > tpm:
            tokens = float(tpm)
    return Levels(requests, tokens, levels.in_flight)


def judge(levels: Levels, limits: Limits, tokens: int) -> Verdict:
    """May a request of `tokens` estimated tokens start, given the key's refilled levels? An
    allowed verdict reports what remains once it is charged."""
    return admit(levels, limits, tokens)[0]


def admit(levels: Levels, limits: Limits, tokens: int) -> tuple[Verdict, Levels]:
    """`judge`, with the levels after it: charged when allowed, unchanged when refused."""
    if limits.tpm is not None and tokens > limits.tpm:
        return Verdict(False, "too_large", REFILL_S, *_remaining(levels, limits)), levels
    wait = 0.0
    reason = ""
    if limits.rpm is not None and levels.requests < 1.0:
        wait, reason = (1.0 - levels.requests) * REFILL_S / limits.rpm, "requests"
    if limits.tpm is not None and levels.tokens < tokens:
        token_wait = (tokens - levels.tokens) * REFILL_S / limits.tpm
        if token_wait > wait:
            wait, reason = token_wait, "tokens"
    if not reason and limits.max_concurrency is not None and levels.in_flight >= limits.max_concurrency:
        wait, reason = 1.0, "concurrency"
    if reason:
        return Verdict(False, reason, wait, *_remaining(levels, limits)), levels
    charged = charge(levels, limits, tokens)
    return Verdict(True, "", 0.0, *_remaining(charged, limits)), charged


def charge(levels: Levels, limits: Limits, tokens: int) -> Levels:
    requests = levels.requests - 1.0 if limits.rpm is not None else levels.requests
    left = levels.tokens - tokens if limits.tpm is not None else levels.tokens
    return Levels(requests, left, levels.in_flight + 1)


def settled(levels: Levels, limits: Limits, charged: int, used: int | None) -> Levels:
    """The request ended: its concurrency slot is free and, when `used` is known, its token
    charge is corrected by `used - charged`."""
    tokens = levels.tokens
    if used is not None and limits.tpm is not None:
        # May go below zero: an underestimate is paid back from the next requests' allowance.
        tokens = min(float(limits.tpm), tokens - (used - charged))
    return Levels(levels.requests, tokens, max(0, levels.in_flight - 1))


def refunded(levels: Levels, limits: Limits, charged: int) -> Levels:
    """The request ended unserved: its slot, its request and its tokens are given back."""
    requests, tokens = levels.requests, levels.tokens
    if limits.rpm is not None:
        requests = min(float(limits.rpm), requests + 1.0)
    if limits.tpm is not None:
        tokens = min(float(limits.tpm), tokens + charged)
    return Levels(requests, tokens, max(0, levels.in_flight - 1))


def _remaining(levels: Levels, limits: Limits) -> tuple[int | None, int | None]:
    return _floor(levels.requests, limits.rpm), _floor(levels.tokens, limits.tpm)


def _floor(level: float, limit: int | None) -> int | None:
    return None if limit is None else max(0, math.floor(level))


class RateStore(Protocol):
    """Where keys' levels live. `now` is the caller's monotonic clock; a store shared between
    processes keeps its own clock instead."""

    async def acquire(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        """Charge one request of `tokens` estimated tokens if every limit allows it."""
        ...

    async def settle(self, key: str, limits: Limits, charged: int, used: int | None, now: float) -> None:
        """A recorded request ended (see `settled`)."""
        ...

    async def refund(self, key: str, limits: Limits, charged: int, now: float) -> None:
        """A recorded request ended unserved, refused further on (see `refunded`)."""
        ...


class MemoryRateStore:
    """The levels of one router process. Keys come from the profile, so the table is as bounded
    as the key list. Its work never waits, so the request path calls `take` and `release`
    directly; the coroutines serve callers of the `RateStore` protocol."""

    def __init__(self) -> None:
        self._keys: dict[str, tuple[Levels, float]] = {}

    def _current(self, key: str, limits: Limits, now: float) -> Levels:
        found = self._keys.get(key)
        if found is None:
            return Levels.full(limits)
        levels, updated = found
        return refill(levels, limits, now - updated)

    def take(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        """`acquire`, without a coroutine."""
        verdict, levels = admit(self._current(key, limits, now), limits, tokens)
        self._keys[key] = (levels, now)
        return verdict

    def release(
        self, key: str, limits: Limits, charged: int, used: int | None, now: float, served: bool
    ) -> None:
        """`settle` when the request was served, else `refund`, without a coroutine."""
        levels = self._current(key, limits, now)
        levels = settled(levels, limits, charged, used) if served else refunded(levels, limits, charged)
        self._keys[key] = (levels, now)

    async def acquire(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        return self.take(key, limits, tokens, now)

    async def settle(self, key: str, limits: Limits, charged: int, used: int | None, now: float) -> None:
        self.release(key, limits, charged, used, now, served=True)

    async def refund(self, key: str, limits: Limits, charged: int, now: float) -> None:
        self.release(key, limits, charged, None, now, served=False)


# A request let through uncounted: the shared levels could not be reached and the policy is open.
UNCOUNTED = Verdict(True, recorded=False)


def estimate_tokens(prompt_tokens: int, output_bound: int | None, sequences: int = 1) -> int:
    """The most a request can cost: its prompt and every sequence's output bound."""
    return prompt_tokens + (output_bound or 0) * sequences


def rate_headers(verdict: Verdict) -> list[tuple[bytes, bytes]]:
    out = []
    if verdict.remaining_requests is not None:
        out.append((b"x-ratelimit-remaining-requests", b"%d" % verdict.remaining_requests))
    if verdict.remaining_tokens is not None:
        out.append((b"x-ratelimit-remaining-tokens", b"%d" % verdict.remaining_tokens))
    return out


_MESSAGES = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "concurrent requests",
    "too_large": "tokens per minute (this request alone is larger than the limit)",
}


def refusal(verdict: Verdict) -> RateLimited:
    headers = {k.decode(): v.decode() for k, v in rate_headers(verdict)}
    code = "request_too_large" if verdict.reason == "too_large" else f"rate_limit_{verdict.reason}"
    return RateLimited(
        f"rate limit reached for this key: {_MESSAGES[verdict.reason]}",
        code=code,
        retry_after=max(1.0, math.ceil(verdict.retry_after_s)),
        headers=headers,
    )


# The usage object of an OpenAI response (the JSON body, or the last SSE event when the client
# asked for stream_options.include_usage).
_TOTAL = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
USAGE_TAIL_BYTES = 2048


def parse_usage(tail: bytes) -> int | None:
    """Total tokens from the last `usage` object in the tail of a response, if there is one."""
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None
    usage = tail[at:]
    total = _TOTAL.search(usage)
    if total is not None:
        return int(total.group(1))
    prompt, completion = _PROMPT.search(usage), _COMPLETION.search(usage)
    if prompt is None or completion is None:
        return None
    return int(prompt.group(1)) + int(completion.group(1))
