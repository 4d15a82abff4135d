"""Per-key rate limits: requests per minute, tokens per minute, concurrent requests.

Requests and tokens are token buckets that refill continuously (a full minute's allowance at
most), so a key may burst up to its per-minute limit and is then paced. A request's tokens are
estimated up front (prompt tokens + max_tokens, or DEFAULT_OUTPUT_TOKENS when the request sets
none) and corrected when the response reports its real usage. A refused request takes nothing:
every limit is checked before any is charged.

The counters live behind `RateStore`, a small interface whose in-memory implementation serves
one router process; a shared store (e.g. Redis, one atomic script per call) gives several
replicas one set of counters without changing callers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Protocol

from router.errors import RateLimited

# Output tokens assumed for a request that sets no max_tokens, until its usage is known.
DEFAULT_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrency is not None


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str = ""  # requests | tokens | concurrency | too_large when refused
    retry_after_s: float = 0.0
    remaining_requests: int | None = None
    remaining_tokens: int | None = None


class RateStore(Protocol):
    def acquire(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        """Charge one request of `tokens` estimated tokens if every limit allows it."""
        ...

    def settle(self, key: str, limits: Limits, charged: int, used: int | None, now: float) -> None:
        """The request ended: release its concurrency slot and, when `used` is known, correct the
        token charge by `used - charged`."""
        ...

    def refund(self, key: str, limits: Limits, charged: int, now: float) -> None:
        """The request ended unserved (refused further on): release its concurrency slot and
        give back its request and its tokens."""
        ...


@dataclass(slots=True)
class _Buckets:
    requests: float
    tokens: float
    updated: float
    in_flight: int = 0


class MemoryRateStore:
    """The counters of one router process. Keys come from the profile, so the table is as
    bounded as the key list."""

    def __init__(self) -> None:
        self._keys: dict[str, _Buckets] = {}

    def _refilled(self, key: str, limits: Limits, now: float) -> _Buckets:
        b = self._keys.get(key)
        if b is None:
            b = self._keys[key] = _Buckets(float(limits.rpm or 0), float(limits.tpm or 0), now)
            return b
        elapsed = max(0.0, now - b.updated)
        b.updated = now
        if limits.rpm is not None:
            b.requests = min(float(limits.rpm), b.requests + elapsed * limits.rpm / 60.0)
        if limits.tpm is not None:
            b.tokens = min(float(limits.tpm), b.tokens + elapsed * limits.tpm / 60.0)
        return b

    def acquire(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        b = self._refilled(key, limits, now)
        if limits.tpm is not None and tokens > limits.tpm:
            return Verdict(
                False, "too_large", 60.0, _floor(b.requests, limits.rpm), _floor(b.tokens, limits.tpm)
            )
        wait = 0.0
        reason = ""
        if limits.rpm is not None and b.requests < 1.0:
            wait, reason = (1.0 - b.requests) * 60.0 / limits.rpm, "requests"
        if limits.tpm is not None and b.tokens < tokens:
            token_wait = (tokens - b.tokens) * 60.0 / limits.tpm
            if token_wait > wait:
                wait, reason = token_wait, "tokens"
        if not reason and limits.max_concurrency is not None and b.in_flight >= limits.max_concurrency:
            wait, reason = 1.0, "concurrency"
        if reason:
            return Verdict(False, reason, wait, _floor(b.requests, limits.rpm), _floor(b.tokens, limits.tpm))
        if limits.rpm is not None:
            b.requests -= 1.0
        if limits.tpm is not None:
            b.tokens -= tokens
        b.in_flight += 1
        return Verdict(True, "", 0.0, _floor(b.requests, limits.rpm), _floor(b.tokens, limits.tpm))

    def settle(self, key: str, limits: Limits, charged: int, used: int | None, now: float) -> None:
        b = self._refilled(key, limits, now)
        b.in_flight = max(0, b.in_flight - 1)
        if used is not None and limits.tpm is not None:
            # May go below zero: an underestimate is paid back from the next requests' allowance.
            b.tokens = min(float(limits.tpm), b.tokens - (used - charged))

    def refund(self, key: str, limits: Limits, charged: int, now: float) -> None:
        b = self._refilled(key, limits, now)
        b.in_flight = max(0, b.in_flight - 1)
        if limits.rpm is not None:
            b.requests = min(float(limits.rpm), b.requests + 1.0)
        if limits.tpm is not None:
            b.tokens = min(float(limits.tpm), b.tokens + charged)


def _floor(level: float, limit: int | None) -> int | None:
    return None if limit is None else max(0, math.floor(level))


def estimate_tokens(prompt_tokens: int, max_tokens: int | None) -> int:
    return prompt_tokens + (max_tokens if max_tokens is not None else DEFAULT_OUTPUT_TOKENS)


def rate_headers(verdict: Verdict) -> list[tuple[bytes, bytes]]:
    out = []
    if verdict.remaining_requests is not None:
        out.append((b"x-ratelimit-remaining-requests", str(verdict.remaining_requests).encode()))
    if verdict.remaining_tokens is not None:
        out.append((b"x-ratelimit-remaining-tokens", str(verdict.remaining_tokens).encode()))
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
