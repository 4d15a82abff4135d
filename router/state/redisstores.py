"""Rate-limit levels and the slow-client memory in Redis, for several router replicas.

Rate limits: one hash per key (`<prefix>rate:<key>`: requests and tokens left, last update)
and, for a key with a concurrency limit, a sorted set of the requests it has in flight
(`<prefix>rate:<key>:c`), each a token of its own scored with the instant its lease runs out.
Each acquire is one Lua script, run atomically by Redis: refill the levels to Redis's own clock
(replicas' clocks do not matter), drop the in-flight tokens whose lease ran out, charge the
request only if every limit allows it, and return the levels it found. The script's arithmetic
is that of `router.keys.ratelimit` (`refill`, `judge`'s conditions, `charge`, `settled`,
`refunded`), and `judge` computes the verdict from the returned levels, so retry times,
remaining counts and refusal reasons are those of the memory store. Because the check and the
charge are one script, N replicas together admit exactly a key's limit. A hash expires once its
buckets would have refilled anyway.

A concurrency slot is a lease of `lease_s`: the replica renews the tokens of its requests in
flight every third of it and gives a token back when its request ends. A refused request renews
nothing. So a replica that died (SIGKILL included) leaves its slots for at most `lease_s`; and
an acquire Redis ran after the replica gave up waiting for it (a stall longer than
`timeout_s`) is given back by its token once Redis answers again — or, if the give-back arrives
first, leaves a mark that stops the late charge — and expires within `lease_s` in any case.

Slow clients: one key per identity (`<prefix>slow:<digest>`), set with the memory's TTL when a
replica sees the client lag; another replica asks for the remaining TTL and remembers the answer
locally for that long.

When Redis does not answer (`SharedStateDown`) an acquire follows `state.on_error`: `open` lets
the request through uncounted (it will not be settled), `closed` refuses it with 503. Settling,
marking and lookups never fail a request."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import secrets
import time
from typing import Any, Final

from redis.asyncio import Redis

from router.errors import Unavailable
from router.keys.ratelimit import UNCOUNTED, Levels, Limits, Verdict, judge
from router.state.shared import SharedState, SharedStateDown

# Shared by the scripts: read and refill KEYS[1]'s levels at Redis's clock, and write them back
# with an expiry; count the requests in flight in KEYS[2]. ARGV[1..3] are rpm, tpm and
# max_concurrency, -1 when unlimited; ARGV[4] is lease_s, how long a request's slot outlives
# its last renewal. KEYS[3] marks a request given up (its token's give-back came first).
_LEVELS = """
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local maxc = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local h = redis.call('HMGET', KEYS[1], 'r', 't', 'f', 'u')
local r, tok
local f = 0
if h[4] then
  r = tonumber(h[1])
  tok = tonumber(h[2])
  local elapsed = math.max(0, now - tonumber(h[4]))
  if rpm >= 0 then r = math.min(rpm, r + elapsed * rpm / 60) end
  if tpm >= 0 then tok = math.min(tpm, tok + elapsed * tpm / 60) end
else
  r = math.max(rpm, 0)
  tok = math.max(tpm, 0)
end
local function fmt(x) return string.format('%.17g', x) end
local function store(r2, t2)
  local s = 1
  if rpm > 0 then s = math.max(s, (rpm - r2) * 60 / rpm) end
  if tpm > 0 then s = math.max(s, (tpm - t2) * 60 / tpm) end
  redis.call('HSET', KEYS[1], 'r', fmt(r2), 't', fmt(t2), 'u', fmt(now))
  redis.call('PEXPIRE', KEYS[1], math.ceil(s * 1000) + 1000)
end
-- The key's requests in flight: KEYS[2]'s tokens whose lease has not run out.
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if maxc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
  f = redis.call('ZCARD', KEYS[2])
end
"""

# ARGV[5] the request's estimated tokens, ARGV[6] its token.
# Returns {charged 0|1, requests, tokens, in_flight} as found before the charge.
_ACQUIRE = (
    _LEVELS
    + """
local cost = tonumber(ARGV[5])
local ok = true
if tpm >= 0 and (cost > tpm or tok < cost) then ok = false end
if rpm >= 0 and r < 1 then ok = false end
if maxc >= 0 and f >= maxc then ok = false end
if redis.call('EXISTS', KEYS[3]) == 1 then ok = false end
if ok then
  local r2, t2 = r, tok
  if rpm >= 0 then r2 = r - 1 end
  if tpm >= 0 then t2 = tok - cost end
  if maxc >= 0 then
    redis.call('ZADD', KEYS[2], now_ms + math.ceil(lease * 1000), ARGV[6])
    redis.call('PEXPIRE', KEYS[2], math.ceil(lease * 1000) + 1000)
  end
  store(r2, t2)
else
  store(r, tok)
end
return {ok and 1 or 0, fmt(r), fmt(tok), f}
"""
)

# ARGV[5] 'settle', 'refund' or 'cancel' (the caller gave up waiting for the acquire: refund it
# if Redis ran it, else mark the token so that it never will), ARGV[6] tokens charged, ARGV[7]
# tokens used (-1: unknown), ARGV[8] the request's token (empty: none).
_RELEASE = (
    _LEVELS
    + """
local charged = tonumber(ARGV[6])
local used = tonumber(ARGV[7])
local mode = ARGV[5]
local held = ARGV[8] ~= '' and redis.call('ZREM', KEYS[2], ARGV[8]) == 1
if mode == 'cancel' then
  if not held then
    redis.call('SET', KEYS[3], '1', 'PX', math.ceil(lease * 1000))
    return 0
  end
  mode = 'refund'
end
if mode == 'refund' then
  if rpm >= 0 then r = math.min(rpm, r + 1) end
  if tpm >= 0 then tok = math.min(tpm, tok + charged) end
elseif used >= 0 and tpm >= 0 then
  tok = math.min(tpm, tok - (used - charged))
end
store(r, tok)
return 1
"""
)

# Renew the leases of a replica's requests in flight on one key. KEYS[1] the key's set of
# requests in flight; ARGV[1] lease_s, ARGV[2..] the tokens. A token that already expired stays
# gone: its slot may have been granted again.
_RENEW = """
local clock = redis.call('TIME')
local lease_ms = math.ceil(tonumber(ARGV[1]) * 1000)
local until_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + lease_ms
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], lease_ms + 1000)
return 1
"""


RENEWALS_PER_LEASE: Final = 3


def _limit(value: int | None) -> int:
    return -1 if value is None else value


class RedisRateStore:
    """`RateStore` over Redis; `now` is ignored (the scripts use Redis's clock)."""

    def __init__(self, state: SharedState) -> None:
        self._state = state
        self._acquire = state.client.register_script(_ACQUIRE)
        self._release = state.client.register_script(_RELEASE)
        self._renew = state.client.register_script(_RENEW)
        self._run = secrets.token_hex(8)
        self._tokens = itertools.count()
        self._held: dict[str, list[str]] = {}  # per key, the tokens of this replica's requests in flight
        self._cancels: dict[tuple[str, str], tuple[Limits, float]] = {}  # (key, token): limits, given up at
        self._renewing: asyncio.Task[None] | None = None
        self._cancelled = asyncio.Event()

    def _args(self, limits: Limits) -> list[Any]:
        lease = self._state.config.lease_s
        return [_limit(limits.rpm), _limit(limits.tpm), _limit(limits.max_concurrency), lease]

    def _keys(self, key: str, token: str) -> list[str]:
        state = self._state
        return [state.key("rate", key), state.key("rate", key, "c"), state.key("rate", key, "x", token)]

    async def acquire(self, key: str, limits: Limits, tokens: int, now: float) -> Verdict:
        token = f"{self._run}:{next(self._tokens)}"
        keys, args = self._keys(key, token), [*self._args(limits), tokens, token]

        async def call(client: Redis) -> Any:
            return await self._acquire(keys, args, client)

        try:
            charged, requests, left, in_flight = await self._state.run("rate_acquire", call)
        except SharedStateDown as down:
            if down.__cause__ is not None:  # sent, maybe run later: give it back by its token
                self._give_up(key, token, limits)
            if self._state.config.on_error == "open":
                return UNCOUNTED
            raise Unavailable(
                "per-key rate limits cannot be checked: the shared state is unavailable",
                code="rate_limit_state_unavailable",
                retry_after=self._state.retry_after_s(),
            ) from None
        except asyncio.CancelledError:
            self._give_up(key, token, limits)
            raise
        if charged and limits.max_concurrency is not None:
            self._held.setdefault(key, []).append(token)
            self._keep_renewing()
        verdict = judge(Levels(float(requests), float(left), int(in_flight)), limits, tokens)
        if verdict.allowed != bool(charged):
            # Unreachable while the script and `judge` agree; the script's answer is what Redis holds.
            return Verdict(
                bool(charged),
                verdict.reason or "requests",
                max(1.0, verdict.retry_after_s),
                verdict.levels,
                limits=limits,
            )
        return verdict

    async def settle(self, key: str, limits: Limits, charged: int, used: int | None, now: float) -> None:
        corrects = limits.tpm is not None and used is not None and used != charged
        if limits.max_concurrency is None and not corrects:
            return  # nothing to give back: no slot taken, no token charge to correct
        await self._release_one(key, limits, "settle", charged, -1 if used is None else used)

    async def refund(self, key: str, limits: Limits, charged: int, now: float) -> None:
        await self._release_one(key, limits, "refund", charged, -1)

    async def _release_one(self, key: str, limits: Limits, mode: str, charged: int, used: int) -> None:
        # This replica's requests on one key are alike: any of its tokens frees the slot.
        held = self._held.get(key)
        token = held.pop() if held else ""
        if held == []:
            del self._held[key]
        keys, args = self._keys(key, token), [*self._args(limits), mode, charged, used, token]

        async def call(client: Redis) -> Any:
            return await self._release(keys, args, client)

        # On failure the slot stays taken in Redis until its lease runs out (lease_s).
        with contextlib.suppress(SharedStateDown):
            await self._state.run(f"rate_{mode}", call)

    def _give_up(self, key: str, token: str, limits: Limits) -> None:
        """The caller stopped waiting for an acquire Redis may still run: cancel it by its
        token once Redis answers (the renewal's turns retry it)."""
        self._cancels[(key, token)] = (limits, time.monotonic())
        self._keep_renewing()
        self._cancelled.set()  # a renewal turn sleeping until its next renewal tries it now

    # -- the leases of requests in flight ----------------------------------------------------

    def _keep_renewing(self) -> None:
        if self._renewing is None:
            self._renewing = asyncio.get_running_loop().create_task(self._renew_while_held())

    async def _renew_while_held(self) -> None:
        cfg = self._state.config
        every = cfg.lease_s / RENEWALS_PER_LEASE
        renewed = time.monotonic()
        try:
            while self._held or self._cancels:
                self._cancelled.clear()
                await self._cancel_pending()
                # Cancels are retried as soon as Redis may be asked again; renewals every `every`.
                pause = min(every, cfg.recheck_s) if self._cancels else every - (time.monotonic() - renewed)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, pause)):
                        await self._cancelled.wait()
                if time.monotonic() - renewed >= every:
                    renewed = time.monotonic()
                    for key, held in list(self._held.items()):
                        await self._renew_key(key, list(held))
        finally:
            self._renewing = None

    async def _renew_key(self, key: str, tokens: list[str]) -> None:
        if not tokens:
            return
        keys = [self._state.key("rate", key, "c")]
        args: list[Any] = [self._state.config.lease_s, *tokens]

        async def call(client: Redis) -> Any:
            return await self._renew(keys, args, client)

        with contextlib.suppress(SharedStateDown):
            await self._state.run("rate_renew", call)

    async def _cancel_pending(self) -> None:
        lease = self._state.config.lease_s
        for (key, token), (limits, since) in list(self._cancels.items()):
            if time.monotonic() - since > lease:
                del self._cancels[(key, token)]  # a late charge has expired by now anyway
                continue
            keys, args = self._keys(key, token), [*self._args(limits), "cancel", 0, -1, token]

            async def call(client: Redis, keys: list[str] = keys, args: list[Any] = args) -> Any:
                return await self._release(keys, args, client)

            try:
                await self._state.run("rate_cancel", call)
            except SharedStateDown:
                return  # Redis is still away: the next turn tries again
            del self._cancels[(key, token)]


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
