"""Per-key rate limits: requests per minute, tokens per minute, concurrent requests.

Requests and tokens are token buckets that refill continuously (a full minute's allowance at
most), so a key may burst up to its per-minute limit and is then paced. A request's tokens are
charged up front at their upper bound — the prompt estimate plus the output bound the backend
receives, times its sequences (router.request.rewrite writes a bound into every request) — and
corrected when the response reports its real usage. A refused request takes nothing:
every limit is checked before any is charged.

The limiter itself is pure: `refill`, `judge`, `charge`, `settled` and `refunded` compute from a
key's `Levels` (what is left of each bucket and the requests in flight). Where the levels live is
the `RateStore`'s business: `MemoryRateStore` serves one router process; the Redis store of
`router.state.redisstores` keeps one set of levels for several replicas, updated by atomic scripts
that do the same arithmetic, and hands the levels it found back to `judge`.
"""

from __future__ import annotations

from typing import Final, NamedTuple, Protocol

# A bucket refills from empty to full in one minute.
REFILL_S: Final = 60.0


class Limits(NamedTuple):
    """A key's limits, from its profile entry: made once per key, read by every request."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrency is not None


# Levels and verdicts are plain classes, not named tuples: every request makes a verdict and new
# levels, and a compiled class is built by one C call and read field by field as C values, where
# a named tuple is built through Python's tuple constructor and its floats are boxed and unboxed at
# every step (router/keys/ratelimit.py is on the compiled request path, docs/compiled.md). Both are
# values: nothing changes them once built.


class Verdict:
    """A request's answer from the limiter, with the key's levels it saw (after its charge when
    allowed). What the headers state — what is left, when each bucket is full again — is read
    from those levels only where a header is written (router/keys/rateheaders.py)."""

    __slots__ = ("allowed", "levels", "limits", "reason", "recorded", "retry_after_s")

    def __init__(
        self,
        allowed: bool,
        reason: str = "",
        retry_after_s: float = 0.0,
        levels: Levels | None = None,
        *,
        limits: Limits | None = None,
        recorded: bool = True,
    ) -> None:
        self.allowed: Final = allowed
        self.reason: Final = reason  # requests | tokens | concurrency | too_large when refused
        self.retry_after_s: Final = retry_after_s
        self.levels: Final = levels
        self.limits: Final = limits
        # The store charged this request: it must be settled or refunded. False when a shared
        # store could not be reached and its policy let the request through uncounted.
        self.recorded: Final = recorded

    @property
    def remaining_requests(self) -> int | None:
        """Whole requests left under the key's rpm (never below 0), None without one."""
        levels, limits = self.levels, self.limits
        if levels is None or limits is None or limits.rpm is None:
            return None
        return whole(levels.requests)

    @property
    def remaining_tokens(self) -> int | None:
        levels, limits = self.levels, self.limits
        if levels is None or limits is None or limits.tpm is None:
            return None
        return whole(levels.tokens)

    @property
    def reset_requests_s(self) -> float:
        """Seconds until the requests bucket is full again (OpenAI's x-ratelimit-reset-requests)."""
        levels, limits = self.levels, self.limits
        if levels is None or limits is None or limits.rpm is None:
            return 0.0
        return until_full(levels.requests, limits.rpm)

    @property
    def reset_tokens_s(self) -> float:
        """Seconds until the tokens bucket is full again: more than a minute under a debt."""
        levels, limits = self.levels, self.limits
        if levels is None or limits is None or limits.tpm is None:
            return 0.0
        return until_full(levels.tokens, limits.tpm)

    def __repr__(self) -> str:
        return (
            f"Verdict(allowed={self.allowed}, reason={self.reason!r}, retry_after_s={self.retry_after_s},"
            f" remaining_requests={self.remaining_requests}, remaining_tokens={self.remaining_tokens},"
            f" recorded={self.recorded})"
        )


def whole(left: float) -> int:
    """A bucket's whole requests or tokens left, never below 0."""
    return int(left) if left > 0.0 else 0


def until_full(left: float, limit: int) -> float:
    """Seconds until a bucket holding `left` of `limit` is full again at its refill rate."""
    if limit <= 0 or left >= limit:
        return 0.0
    return (limit - left) * REFILL_S / limit


class Levels:
    """One key's buckets: requests and tokens left (tokens may be negative after an
    underestimate), and its requests in flight."""

    __slots__ = ("in_flight", "requests", "tokens")

    def __init__(self, requests: float, tokens: float, in_flight: int = 0) -> None:
        self.requests: Final = requests
        self.tokens: Final = tokens
        self.in_flight: Final = in_flight

    @staticmethod
    def full(limits: Limits) -> Levels:
        return Levels(float(limits.rpm or 0), float(limits.tpm or 0))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Levels):
            return NotImplemented
        return (
            self.requests == other.requests
            and self.tokens == other.tokens
            and self.in_flight == other.in_flight
        )

    def __repr__(self) -> str:
        return f"Levels(requests={self.requests}, tokens={self.tokens}, in_flight={self.in_flight})"


def refill(levels: Levels, limits: Limits, elapsed_s: float) -> Levels:
    elapsed = elapsed_s if elapsed_s > 0.0 else 0.0
    requests, tokens = levels.requests, levels.tokens
    rpm, tpm, _ = limits
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
    rpm, tpm, max_concurrency = limits
    if tpm is not None and tokens > tpm:
        return Verdict(False, "too_large", REFILL_S, levels, limits=limits), levels
    requests_left, tokens_left = levels.requests, levels.tokens
    wait = 0.0
    reason = ""
    if rpm is not None and requests_left < 1.0:
        wait, reason = (1.0 - requests_left) * REFILL_S / rpm, "requests"
    if tpm is not None and tokens_left < tokens:
        token_wait = (tokens - tokens_left) * REFILL_S / tpm
        if token_wait > wait:
            wait, reason = token_wait, "tokens"
    if not reason and max_concurrency is not None and levels.in_flight >= max_concurrency:
        wait, reason = 1.0, "concurrency"
    if reason:
        return Verdict(False, reason, wait, levels, limits=limits), levels
    charged = charge(levels, limits, tokens)
    return Verdict(True, "", 0.0, charged, limits=limits), charged


def charge(levels: Levels, limits: Limits, tokens: int) -> Levels:
    requests, left = levels.requests, levels.tokens
    rpm, tpm, _ = limits
    if rpm is not None:
        requests -= 1.0
    if tpm is not None:
        left -= tokens
    return Levels(requests, left, levels.in_flight + 1)


def settled(levels: Levels, limits: Limits, charged: int, used: int | None) -> Levels:
    """The request ended: its concurrency slot is free and, when `used` is known, its token
    charge is corrected by `used - charged`."""
    tokens = levels.tokens
    tpm = limits.tpm
    if used is not None and tpm is not None:
        # May go below zero: an underestimate is paid back from the next requests' allowance.
        tokens = min(float(tpm), tokens - (used - charged))
    in_flight = levels.in_flight
    return Levels(levels.requests, tokens, in_flight - 1 if in_flight > 0 else 0)


def refunded(levels: Levels, limits: Limits, charged: int) -> Levels:
    """The request ended unserved: its slot, its request and its tokens are given back."""
    requests, tokens = levels.requests, levels.tokens
    rpm, tpm, _ = limits
    if rpm is not None:
        requests = min(float(rpm), requests + 1.0)
    if tpm is not None:
        tokens = min(float(tpm), tokens + charged)
    in_flight = levels.in_flight
    return Levels(requests, tokens, in_flight - 1 if in_flight > 0 else 0)


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
        self._keys: dict[str, _Held] = {}

    def take(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        """`acquire`, without a coroutine."""
        held = self._held(key, limits, now)
        verdict, held.levels = admit(held.levels, limits, tokens)
        return verdict

    def release(
        self, key: str, limits: Limits, charged: int, used: int | None, now: float, served: bool
    ) -> None:
        """`settle` when the request was served, else `refund`, without a coroutine."""
        held = self._held(key, limits, now)
        levels = held.levels
        held.levels = settled(levels, limits, charged, used) if served else refunded(levels, limits, charged)

    def _held(self, key: str, limits: Limits, now: float) -> _Held:
        """The key's levels refilled up to `now`, which they are then taken at."""
        held = self._keys.get(key)
        if held is None:
            held = self._keys[key] = _Held(Levels.full(limits), now)
        else:
            held.levels = refill(held.levels, limits, now - held.at)
            held.at = now
        return held

    async def acquire(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        return self.take(key, limits, tokens, now)

    async def settle(self, key: str, limits: Limits, charged: int, used: int | None, now: float) -> None:
        self.release(key, limits, charged, used, now, served=True)

    async def refund(self, key: str, limits: Limits, charged: int, now: float) -> None:
        self.release(key, limits, charged, None, now, served=False)


class _Held:
    """A key's levels in the in-process store and the time they were refilled to."""

    __slots__ = ("at", "levels")

    def __init__(self, levels: Levels, at: float) -> None:
        self.levels = levels
        self.at = at


# A request let through uncounted: the shared levels could not be reached and the policy is open.
UNCOUNTED: Final = Verdict(True, recorded=False)


def estimate_tokens(prompt_tokens: int, output_bound: int | None, sequences: int = 1) -> int:
    """The most a request can cost: its prompt and every sequence's output bound."""
    return prompt_tokens + (output_bound or 0) * sequences


# The usage object of an OpenAI response (the JSON body, or the last SSE event when the client
# asked for stream_options.include_usage) is looked for in its last USAGE_TAIL_BYTES.
USAGE_TAIL_BYTES: Final = 2048
_USAGE: Final = b'"usage"'
_TOTAL: Final = b'"total_tokens"'
_PROMPT: Final = b'"prompt_tokens"'
_COMPLETION: Final = b'"completion_tokens"'


def usage_at(tail: bytes) -> int:
    """Where the last `usage` key in the last USAGE_TAIL_BYTES of `tail` starts, -1 if there is
    none. A tail may hold more (router/proxy/chunklog.py `UsageTail.value`): what comes before
    those bytes is not searched, as if it had been cut off."""
    return tail.rfind(_USAGE, max(0, len(tail) - USAGE_TAIL_BYTES))


def parse_usage(tail: bytes) -> int | None:
    """Total tokens from the last `usage` object in the tail of a response, if there is one."""
    at = usage_at(tail)
    if at < 0:
        return None
    total = _count_after(tail, _TOTAL, at)
    if total is not None:
        return total
    prompt, completion = _count_after(tail, _PROMPT, at), _count_after(tail, _COMPLETION, at)
    if prompt is None or completion is None:
        return _anthropic_usage(tail, at)
    return prompt + completion


# Anthropic's usage (the Messages API, a body's or a stream's last `message_delta`): the input
# not read from the prefix cache, the cached input beside it, and the output.
_INPUT: Final = b'"input_tokens"'
_OUTPUT: Final = b'"output_tokens"'
_CACHED: Final = (b'"cache_read_input_tokens"', b'"cache_creation_input_tokens"')


def _anthropic_usage(tail: bytes, at: int) -> int | None:
    prompt, completion = _count_after(tail, _INPUT, at), _count_after(tail, _OUTPUT, at)
    if prompt is None or completion is None:
        return None
    for name in _CACHED:
        prompt += _count_after(tail, name, at) or 0
    return prompt + completion


_MAX_DIGITS: Final = 12


def believed(used: int | None, charged: int, limits: Limits) -> int | None:
    """The usage a settlement takes: what the response reported, but at most one minute of the
    key's tokens beyond its charge, so that a backend reporting an absurd usage leaves its
    tenant a debt of a minute at most, not a key locked for good."""
    tpm = limits.tpm
    if used is None or tpm is None:
        return used
    return min(used, charged + tpm)


def _count_after(text: bytes, name: bytes, start: int) -> int | None:
    """The number in the first `name: <digits>` of `text` from `start` (JSON whitespace around
    the colon): a scan, as every answer's usage is read, where a regular expression costs
    several times more."""
    size = len(text)
    at = text.find(name, start)
    while at >= 0:
        i = _skip_space(text, at + len(name), size)
        if i < size and text[i] == 58:  # ':'
            first = i = _skip_space(text, i + 1, size)
            while i < size and 48 <= text[i] <= 57:
                i += 1
            if i > first:
                # Longer is no request's count: a backend's nonsense, read as no usage at all.
                return int(text[first:i]) if i - first <= _MAX_DIGITS else None
        at = text.find(name, at + 1)
    return None


def _skip_space(text: bytes, i: int, size: int) -> int:
    while i < size and (text[i] == 32 or 9 <= text[i] <= 13):
        i += 1
    return i
