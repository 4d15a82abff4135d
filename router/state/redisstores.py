"""Rate-limit levels and the slow-client memory in Redis, for several router replicas.

Rate limits: one hash per key (`<prefix>rate:<key>`: requests and tokens left, requests in
flight, last update). Each acquire is one Lua script, run atomically by Redis: refill the levels
to Redis's own clock (replicas' clocks do not matter), charge the request only if every limit
allows it, and return the levels it found. Requests in flight are counted only for keys with a
concurrency limit, so the others are settled without a round trip unless their token charge
needs correcting. The script's arithmetic is that of
`router.keys.ratelimit` (`refill`, `judge`'s conditions, `charge`, `settled`, `refunded`), and
`judge` computes the verdict from the returned levels, so retry times, remaining counts and
refusal reasons are those of the memory store. Because the check and the charge are one script,
N replicas together admit exactly a key's limit. A hash expires once its buckets would have
refilled anyway, or `lease_s` after the last activity while it has requests in flight.

Slow clients: one key per identity (`<prefix>slow:<digest>`), set with the memory's TTL when a
replica sees the client lag; another replica asks for the remaining TTL and remembers the answer
locally for that long.

When Redis does not answer (`SharedStateDown`) an acquire follows `state.on_error`: `open` lets
the request through uncounted (it will not be settled), `closed` refuses it with 503. Settling,
marking and lookups never fail a request."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

from redis.asyncio import Redis

from router.errors import Unavailable
from router.keys.ratelimit import UNCOUNTED, Levels, Limits, Verdict, judge
from router.state.shared import SharedState, SharedStateDown

# Shared by both scripts: read and refill KEYS[1]'s levels at Redis's clock, and write them back
# with an expiry. ARGV[1..3] are rpm, tpm and max_concurrency, -1 when unlimited; ARGV[4] is
# lease_s, how long a hash with requests in flight outlives its last update.
_LEVELS = """
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local maxc = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local h = redis.call('HMGET', KEYS[1], 'r', 't', 'f', 'u')
local r, tok, f
if h[4] then
  r = tonumber(h[1])
  tok = tonumber(h[2])
  f = tonumber(h[3])
  local elapsed = math.max(0, now - tonumber(h[4]))
  if rpm >= 0 then r = math.min(rpm, r + elapsed * rpm / 60) end
  if tpm >= 0 then tok = math.min(tpm, tok + elapsed * tpm / 60) end
else
  r = math.max(rpm, 0)
  tok = math.max(tpm, 0)
  f = 0
end
local function fmt(x) return string.format('%.17g', x) end
local function store(r2, t2, f2)
  local s = 1
  if rpm > 0 then s = math.max(s, (rpm - r2) * 60 / rpm) end
  if tpm > 0 then s = math.max(s, (tpm - t2) * 60 / tpm) end
  if f2 > 0 and maxc >= 0 then s = math.max(s, lease) end
  redis.call('HSET', KEYS[1], 'r', fmt(r2), 't', fmt(t2), 'f', f2, 'u', fmt(now))
  redis.call('PEXPIRE', KEYS[1], math.ceil(s * 1000) + 1000)
end
"""

# ARGV[5] the request's estimated tokens.
# Returns {charged 0|1, requests, tokens, in_flight} as found before the charge.
_ACQUIRE = (
    _LEVELS
    + """
local cost = tonumber(ARGV[5])
local ok = true
if tpm >= 0 and (cost > tpm or tok < cost) then ok = false end
if rpm >= 0 and r < 1 then ok = false end
if maxc >= 0 and f >= maxc then ok = false end
if ok then
  local r2, t2, f2 = r, tok, f
  if rpm >= 0 then r2 = r - 1 end
  if tpm >= 0 then t2 = tok - cost end
  if maxc >= 0 then f2 = f + 1 end
  store(r2, t2, f2)
else
  store(r, tok, f)
end
return {ok and 1 or 0, fmt(r), fmt(tok), f}
"""
)

# ARGV[5] 'settle' or 'refund', ARGV[6] tokens charged, ARGV[7] tokens used (-1: unknown).
_RELEASE = (
    _LEVELS
    + """
local charged = tonumber(ARGV[6])
local used = tonumber(ARGV[7])
if ARGV[5] == 'refund' then
  if rpm >= 0 then r = math.min(rpm, r + 1) end
  if tpm >= 0 then tok = math.min(tpm, tok + charged) end
elseif used >= 0 and tpm >= 0 then
  tok = math.min(tpm, tok - (used - charged))
end
if maxc >= 0 then f = math.max(0, f - 1) end
store(r, tok, f)
return 1
"""
)


def _limit(value: int | None) -> int:
    return -1 if value is None else value


class RedisRateStore:
    """`RateStore` over Redis; `now` is ignored (the scripts use Redis's clock)."""

    def __init__(self, state: SharedState) -> None:
        self._state = state
        self._acquire = state.client.register_script(_ACQUIRE)
        self._release = state.client.register_script(_RELEASE)

    def _args(self, limits: Limits) -> list[Any]:
        lease = self._state.config.lease_s
        return [_limit(limits.rpm), _limit(limits.tpm), _limit(limits.max_concurrency), lease]

    async def acquire(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        keys = [self._state.key("rate", key)]
        args = [*self._args(limits), tokens]

        async def call(client: Redis) -> Any:
            return await self._acquire(keys, args, client)

        try:
            charged, requests, left, in_flight = await self._state.run("rate_acquire", call)
        except SharedStateDown:
            if self._state.config.on_error == "open":
                return UNCOUNTED
            raise Unavailable(
                "per-key rate limits cannot be checked: the shared state is unavailable",
                code="rate_limit_state_unavailable",
                retry_after=max(1.0, self._state.config.recheck_s),
            ) from None
        verdict = judge(Levels(float(requests), float(left), int(in_flight)), limits, tokens)
        if verdict.allowed != bool(charged):
            # Unreachable while the script and `judge` agree; the script's answer is what Redis holds.
            return Verdict(bool(charged), verdict.reason or "requests", max(1.0, verdict.retry_after_s))
        return verdict

    async def settle(self, key: str, limits: Limits, charged: int, used: int | None, now: float) -> None:
        corrects = limits.tpm is not None and used is not None and used != charged
        if limits.max_concurrency is None and not corrects:
            return  # nothing to give back: no slot taken, no token charge to correct
        await self._release_one(key, limits, "settle", charged, -1 if used is None else used)

    async def refund(self, key: str, limits: Limits, charged: int, now: float) -> None:
        await self._release_one(key, limits, "refund", charged, -1)

    async def _release_one(self, key: str, limits: Limits, mode: str, charged: int, used: int) -> None:
        keys = [self._state.key("rate", key)]
        args = [*self._args(limits), mode, charged, used]

        async def call(client: Redis) -> Any:
            return await self._release(keys, args, client)

        # On failure the slot stays taken in Redis until the key's hash expires (lease_s).
        with contextlib.suppress(SharedStateDown):
            await self._state.run(f"rate_{mode}", call)


class RedisSlowClients:
    """`SlowClientStore` over Redis: identities by digest, with their memory's TTL."""

    def __init__(self, state: SharedState) -> None:
        self._state = state

    def _key(self, identity: str) -> str:
        digest = hashlib.blake2b(identity.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
        return self._state.key("slow", digest)

    def publish(self, identity: str, ttl_s: float) -> None:
        key, ms = self._key(identity), max(1, round(ttl_s * 1000))

        async def call(client: Redis) -> object:
            return await client.set(key, b"1", px=ms)

        self._state.spawn("slow_mark", call)

    async def remaining(self, identity: str) -> float | None:
        key = self._key(identity)

        async def call(client: Redis) -> int:
            ms: int = await client.pttl(key)
            return ms

        try:
            ms = await self._state.run("slow_lookup", call)
        except SharedStateDown:
            return None
        return ms / 1000 if ms > 0 else None
