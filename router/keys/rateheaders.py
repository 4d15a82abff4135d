"""Where a key with rate limits stands, in the headers its clients read: OpenAI's
`x-ratelimit-*` on the OpenAI routes, Anthropic's `anthropic-ratelimit-*` on the Messages routes
(a reset there is the time the bucket is full again, RFC 3339), on admitted and refused requests
alike; and the 429 of a refused request, with its Retry-After.

What cannot change — a limit's header — is built once per key (`KeyRates`); what each verdict
says, what is left and when the bucket is full again, is written from the levels the limiter
left (router/keys/ratelimit.py `Verdict`), straight into the response's headers.
"""

from __future__ import annotations

import math
import time
from typing import Final

from router.errors import RETRY_AFTER_MAX_S, RateLimited
from router.keys.pace import Pace
from router.keys.ratelimit import Levels, Limits, Verdict, until_full, whole

Headers = list[tuple[bytes, bytes]]

_MESSAGES: Final = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "concurrent requests",
    "too_large": "tokens per minute (this request alone is larger than the limit)",
}


class Shown:
    """One limit's OpenAI headers as last written. A key far from its limit shows the same
    values request after request (its bucket stays full), so each value is formatted again only
    when it changes: formatting them every time was most of what the headers cost."""

    __slots__ = (
        "_ms",
        "_remaining",
        "_reset",
        "_whole",
        "limit",
        "limit_header",
        "remaining_name",
        "reset_name",
    )

    def __init__(self, limit: int, name: bytes) -> None:
        self.limit: Final = limit
        self.limit_header: Final = (b"x-ratelimit-limit-" + name, b"%d" % limit)
        self.remaining_name: Final = b"x-ratelimit-remaining-" + name
        self.reset_name: Final = b"x-ratelimit-reset-" + name
        self._whole = -1
        self._remaining = (self.remaining_name, b"")
        self._ms = -1
        self._reset = (self.reset_name, b"")

    def write(self, out: Headers, left: float) -> None:
        """The limit, what is left (whole units) and when the bucket is full again (rounded up:
        milliseconds below a second, `duration` above)."""
        whole_left = whole(left)
        if whole_left != self._whole:
            self._whole = whole_left
            self._remaining = (self.remaining_name, b"%d" % whole_left)
        exact_ms = until_full(left, self.limit) * 1000.0
        ms = int(exact_ms) if exact_ms > 0.0 else 0
        if ms < exact_ms:
            ms += 1
        if ms != self._ms:
            self._ms = ms
            self._reset = (self.reset_name, b"%dms" % ms if ms < 1000 else duration(ms / 1000.0))
        out.append(self.limit_header)
        out.append(self._remaining)
        out.append(self._reset)


class KeyRates:
    """A key's limits as every one of its requests reads them, built once with the key: the
    limits, their headers, and how long its requests hold a slot (`pace`, None without a
    `max_concurrency`)."""

    __slots__ = (
        "anthropic_requests",
        "anthropic_tokens",
        "limits",
        "pace",
        "requests",
        "tokens",
    )

    def __init__(self, limits: Limits) -> None:
        self.limits: Final = limits
        rpm, tpm, max_concurrency = limits
        # None: no such limit, and no headers for it.
        self.requests: Final = None if rpm is None else Shown(rpm, b"requests")
        self.tokens: Final = None if tpm is None else Shown(tpm, b"tokens")
        self.anthropic_requests: Final = (b"anthropic-ratelimit-requests-limit", b"%d" % (rpm or 0))
        self.anthropic_tokens: Final = (b"anthropic-ratelimit-tokens-limit", b"%d" % (tpm or 0))
        self.pace: Final = Pace() if max_concurrency is not None else None

    def openai(self, out: Headers, levels: Levels) -> None:
        """OpenAI's headers for each of the key's request and token limits."""
        requests, tokens = self.requests, self.tokens
        if requests is not None:
            requests.write(out, levels.requests)
        if tokens is not None:
            tokens.write(out, levels.tokens)

    def anthropic(self, out: Headers, levels: Levels, now: float) -> None:
        """Anthropic's headers, each reset the wall-clock time (`now`, seconds since the epoch)
        at which the bucket is full again."""
        limits = self.limits
        rpm, tpm = limits.rpm, limits.tpm
        if rpm is not None:
            left = levels.requests
            out.append(self.anthropic_requests)
            out.append((b"anthropic-ratelimit-requests-remaining", b"%d" % whole(left)))
            out.append((b"anthropic-ratelimit-requests-reset", rfc3339(now + until_full(left, rpm))))
        if tpm is not None:
            left = levels.tokens
            out.append(self.anthropic_tokens)
            out.append((b"anthropic-ratelimit-tokens-remaining", b"%d" % whole(left)))
            out.append((b"anthropic-ratelimit-tokens-reset", rfc3339(now + until_full(left, tpm))))


def duration(seconds: float) -> bytes:
    """A reset time as OpenAI writes it, rounded up: `250ms` below a second, else `17s`, `6m0s`."""
    if seconds < 1.0:
        return b"%dms" % math.ceil(seconds * 1000.0) if seconds > 0.0 else b"0ms"
    whole_s = math.ceil(seconds)
    if whole_s < 60:
        return b"%ds" % whole_s
    return b"%dm%ds" % divmod(whole_s, 60)


def rfc3339(at: float) -> bytes:
    """A wall-clock time as Anthropic's reset headers give it, in whole seconds (rounded up), UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(at))).encode()


def refusal(verdict: Verdict, rates: KeyRates, anthropic: bool = False) -> RateLimited:
    """The 429 of a refused verdict, with the key's headers for its route's clients. Its
    Retry-After, in whole seconds within [1 s, a minute]: for a bucket, when it holds enough
    again (a bucket refills whole in a minute); at `max_concurrency`, when one of the key's slots
    is expected to free (router/keys/pace.py)."""
    out: Headers = []
    levels = verdict.levels
    if levels is None:
        pass
    elif anthropic:
        rates.anthropic(out, levels, time.time())
    else:
        rates.openai(out, levels)
    headers = {name.decode(): value.decode() for name, value in out}
    reason = verdict.reason
    too_large = reason == "too_large"
    if too_large:
        # Waiting never lets it through: clients that read this header (the OpenAI and Anthropic
        # SDKs) stop.
        headers["x-should-retry"] = "false"
    pace, slots = rates.pace, rates.limits.max_concurrency
    if reason == "concurrency" and pace is not None and slots is not None:
        wait = pace.wait_s(slots, RETRY_AFTER_MAX_S)
    else:
        wait = max(1.0, min(float(math.ceil(verdict.retry_after_s)), RETRY_AFTER_MAX_S))
    return RateLimited(
        f"rate limit reached for this key: {_MESSAGES[reason]}",
        code="request_too_large" if too_large else f"rate_limit_{reason}",
        retry_after=wait,
        headers=headers,
    )
