"""Rate limits and slow-client memory shared through a real redis-server: several stores (one per
replica) on one Redis behave as one, agree with the memory store, and follow the configured
policy while Redis is away."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from router.config.load import ConfigError, parse_profile
from router.config.models import StateConfig
from router.errors import Unavailable
from router.keys.rateheaders import KeyRates, refusal
from router.keys.ratelimit import Limits, MemoryRateStore, RateStore, Verdict
from router.lanes.slowclient import SlowClients
from router.observe.metrics import Metrics
from router.state.redisstores import RedisRateStore, RedisSlowClients
from router.state.runtime import build_runtime
from router.state.shared import OutageLog, SharedState, describe, redis_url
from tests.support.profiles import profile
from tests.support.redisserver import RedisServer, redis_server


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


class Replicas:
    """Shared states as separate router processes would hold them: each its own pool and metrics."""

    def __init__(self) -> None:
        self.states: list[tuple[SharedState, Metrics]] = []

    def open(self, url: str, **cfg: Any) -> SharedState:
        # A timeout that a busy test machine cannot trip, unless a test is about timeouts.
        cfg.setdefault("timeout_s", 2.0)
        metrics = Metrics()
        state = SharedState(StateConfig(redis_url=url, **cfg), url, metrics)
        self.states.append((state, metrics))
        return state

    def errors(self, state: SharedState, op: str, reason: str) -> float:
        (metrics,) = [m for s, m in self.states if s is state]
        labels = {"op": op, "reason": reason}
        return metrics.registry.get_sample_value("lane_router_shared_state_errors_total", labels) or 0.0

    async def aclose(self) -> None:
        for state, _ in self.states:
            await state.release()


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    r = Replicas()
    try:
        yield r
    finally:
        await r.aclose()


async def test_two_replicas_admit_exactly_the_requests_per_minute_together(
    redis: RedisServer, replicas: Replicas
) -> None:
    # 30 connections opened at once on a busy machine: a timeout longer than the default.
    a, b = (RedisRateStore(replicas.open(redis.url, timeout_s=5)) for _ in range(2))
    limits = Limits(rpm=7)
    # 30 at once, half through each replica: well within a second, so less than one refills.
    calls = [(a if i % 2 else b).acquire("web", limits, 0, 0.0) for i in range(30)]
    verdicts = await asyncio.gather(*calls)

    allowed = [v for v in verdicts if v.allowed]
    assert len(allowed) == 7
    assert sorted(v.remaining_requests for v in allowed) == [0, 1, 2, 3, 4, 5, 6]
    refused = [v for v in verdicts if not v.allowed]
    assert {v.reason for v in refused} == {"requests"}
    assert all(0 < v.retry_after_s <= 60 / 7 for v in refused)


async def test_tokens_per_minute_and_their_correction_are_shared(
    redis: RedisServer, replicas: Replicas
) -> None:
    a, b = RedisRateStore(replicas.open(redis.url)), RedisRateStore(replicas.open(redis.url))
    limits = Limits(tpm=1000)
    verdicts = await asyncio.gather(*[(a, b)[i % 2].acquire("k", limits, 300, 0.0) for i in range(8)])
    assert sum(v.allowed for v in verdicts) == 3

    await a.settle("k", limits, 300, 50, 0.0)  # used 50 of the 300 charged: 250 back
    after = await b.acquire("k", limits, 300, 0.0)
    assert after.allowed and after.remaining_tokens == 50  # 100 left + 250 back - 300, plus a trickle


async def test_a_shared_bucket_tells_a_refusal_and_an_admission_its_refill(
    redis: RedisServer, replicas: Replicas
) -> None:
    a, b = RedisRateStore(replicas.open(redis.url)), RedisRateStore(replicas.open(redis.url))
    limits = Limits(tpm=6000)
    first = await a.acquire("k", limits, 5800, 0.0)
    refused = await b.acquire("k", limits, 500, 0.0)

    # 5800 taken of a full bucket: refilled in 58 s at 100 tokens a second.
    assert first.allowed and first.reset_tokens_s == pytest.approx(58.0)
    assert not refused.allowed and refused.reason == "tokens"
    # 300 tokens short of 500, less what refilled between the two calls.
    assert 0.0 < refused.retry_after_s <= 3.0
    assert refused.reset_tokens_s <= 58.0
    headers = dict(refusal(refused, KeyRates(limits)).headers())
    assert headers[b"retry-after"] == b"%d" % max(1, math.ceil(refused.retry_after_s))
    assert headers[b"x-ratelimit-limit-tokens"] == b"6000"


async def test_concurrency_slots_are_shared_and_released(redis: RedisServer, replicas: Replicas) -> None:
    a, b = RedisRateStore(replicas.open(redis.url)), RedisRateStore(replicas.open(redis.url))
    limits = Limits(max_concurrency=2)
    assert (await a.acquire("k", limits, 0, 0.0)).allowed
    assert (await b.acquire("k", limits, 0, 0.0)).allowed
    refused = await a.acquire("k", limits, 0, 0.0)
    assert not refused.allowed and refused.reason == "concurrency"

    await b.refund("k", limits, 0, 0.0)

    assert (await a.acquire("k", limits, 0, 0.0)).allowed


async def test_the_scripts_agree_with_the_memory_store(redis: RedisServer, replicas: Replicas) -> None:
    """The same operations on both stores give the same verdicts and levels. The scripts read
    Redis's clock, which moves while they run; each writes the instant it used into the key's
    hash (`u`), and the memory store replays the script at those same instants."""
    state = replicas.open(redis.url)
    shared = RedisRateStore(state)
    limits = Limits(rpm=5, tpm=1000, max_concurrency=3)
    script: list[tuple[str, int, int | None]] = [
        ("acquire", 400, None),
        ("acquire", 400, None),
        ("acquire", 400, None),  # tokens short
        ("settle", 400, 100),
        ("acquire", 1200, None),  # larger than the whole minute
        ("acquire", 500, None),
        ("acquire", 10, None),  # no tokens left
        ("refund", 500, None),
        ("acquire", 10, None),
        ("acquire", 10, None),
        ("acquire", 10, None),  # three in flight
    ]
    Outcome = tuple[bool, str, int | None, int | None]

    async def run(store: RateStore, clock: Callable[[int], float], after: Callable[[], Any]) -> list[Outcome]:
        out = []
        for i, (op, tokens, used) in enumerate(script):
            now = clock(i)
            if op == "acquire":
                v: Verdict = await store.acquire("k", limits, tokens, now)
                out.append((v.allowed, v.reason, v.remaining_requests, v.remaining_tokens))
            elif op == "settle":
                await store.settle("k", limits, tokens, used, now)
            else:
                await store.refund("k", limits, tokens, now)
            await after()
        return out

    client = redis.client()
    instants: list[float] = []

    async def note_instant() -> None:
        # '%.17g' in the script: the float read back is the very one the script computed with.
        instants.append(float(await client.hget(state.key("rate", "k"), "u")))

    async def nothing() -> None:
        return None

    try:
        got = await run(shared, lambda i: 0.0, note_instant)
    finally:
        await client.aclose()
    # At one instant (as on a quiet machine): the verdicts the script is written to produce.
    at_once = await run(MemoryRateStore(), lambda i: 0.0, nothing)
    assert [a for a, *_ in at_once] == [True, True, False, False, True, False, True, True, False]
    assert got == await run(MemoryRateStore(), lambda i: instants[i], nothing)


async def test_a_key_expires_once_its_buckets_would_be_full_again(
    redis: RedisServer, replicas: Replicas
) -> None:
    state = replicas.open(redis.url, lease_s=600)
    store = RedisRateStore(state)
    client = redis.client()
    try:
        await store.acquire("paced", Limits(rpm=60), 0, 0.0)  # one request: refilled within 1 s
        await store.acquire("busy", Limits(rpm=60, max_concurrency=4), 0, 0.0)  # one in flight
        paced = await client.pttl(state.key("rate", "paced"))
        busy = await client.pttl(state.key("rate", "busy", "c"))  # its requests in flight
        assert 1000 < paced <= 3000
        assert 599_000 < busy <= 601_000
    finally:
        await client.aclose()


async def test_a_client_marked_slow_by_one_replica_is_slow_for_the_other(
    redis: RedisServer, replicas: Replicas
) -> None:
    one = SlowClients(600, 100, RedisSlowClients(replicas.open(redis.url)))
    other = SlowClients(600, 100, RedisSlowClients(replicas.open(redis.url)))
    one.mark("web\x00id\x00phone", 10.0)

    async with asyncio.timeout(5):  # the mark is written in the background
        while not await other.recall("web\x00id\x00phone", 10.0):
            await asyncio.sleep(0.01)

    assert other.is_slow("web\x00id\x00phone", 10.0)  # now remembered locally too
    assert not other.is_slow("web\x00id\x00phone", 10.0 + 601)  # for no longer than the mark
    assert not await other.recall("web\x00id\x00laptop", 10.0)


async def test_redis_away_fails_open_counts_and_comes_back(redis: RedisServer, replicas: Replicas) -> None:
    state = replicas.open(redis.url, on_error="open", recheck_s=2.0)
    store, limits = RedisRateStore(state), Limits(rpm=1)
    assert (await store.acquire("k", limits, 0, 0.0)).recorded

    await redis.stop()
    during = [await store.acquire("k", limits, 0, 0.0) for _ in range(5)]

    assert all(v.allowed and not v.recorded for v in during)  # over the limit, let through uncounted
    assert replicas.errors(state, "rate_acquire", "connection") == 1
    assert replicas.errors(state, "rate_acquire", "backoff") == 4  # not retried within recheck_s

    await redis.start()  # empty again: the key starts with a full minute
    verdict = await until(lambda: store.acquire("k", limits, 0, 0.0), lambda v: v.recorded)
    assert verdict.allowed and verdict.remaining_requests == 0
    refused = await store.acquire("k", limits, 0, 0.0)
    assert not refused.allowed and refused.recorded


async def test_redis_away_fails_closed_with_a_503(redis: RedisServer, replicas: Replicas) -> None:
    store = RedisRateStore(replicas.open(redis.url, on_error="closed", recheck_s=2.0))
    await redis.stop()

    with pytest.raises(Unavailable) as caught:
        await store.acquire("k", Limits(rpm=10), 0, 0.0)

    err = caught.value
    assert err.status == 503 and err.code == "rate_limit_state_unavailable"
    assert dict(err.headers())[b"retry-after"] == b"2"
    # Settling what was charged before never raises: the request has been served.
    await store.settle("k", Limits(rpm=10), 0, None, 0.0)


async def test_a_redis_that_does_not_answer_times_out_quickly(replicas: Replicas) -> None:
    """A listener that accepts and never replies stands in for a hung or blackholed Redis."""
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        url = f"redis://127.0.0.1:{port}/0"
        store = RedisRateStore(replicas.open(url, timeout_s=0.1))
        loop = asyncio.get_running_loop()
        began = loop.time()
        verdict = await store.acquire("k", Limits(rpm=1), 0, 0.0)
        assert loop.time() - began < 1.0
        assert verdict.allowed and not verdict.recorded
    finally:
        silent.close()


async def until(call: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            result = await call()
            if done(result):
                return result
            await asyncio.sleep(0.05)


def test_an_outage_is_logged_once_then_summed_up_then_its_end(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog("redis://r:6379/0", "open", every_s=30)
    with caplog.at_level(logging.WARNING, logger="lane_router.shared_state"):
        for i in range(1000):
            outage.failed("rate_acquire", "connection", "refused", 100.0 + i * 0.01)  # 10 s
        outage.failed("rate_acquire", "backoff", "waiting", 131.0)
        outage.recovered(140.0)
        outage.recovered(141.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "unavailable (rate_acquire: connection, refused); until it is back" in lines[0]
    assert "rate limits fail open" in lines[0]
    assert "admission counts fall back to this process's share" in lines[0]
    assert "still unavailable: 1000 operations" in lines[1]
    assert "back after 40.0 s (1001 operations" in lines[2]


def test_urls_are_logged_without_credentials() -> None:
    assert describe("redis://user:secret@cache.internal:6380/2") == "redis://cache.internal:6380/2"
    assert describe("unix:///run/redis.sock") == "unix:///run/redis.sock"


def test_the_state_section_is_validated_with_its_path() -> None:
    data = profile(["http://127.0.0.1:9"])
    data["state"] = {"redis_url": "http://cache:6379", "on_error": "sometimes"}
    with pytest.raises(ConfigError) as caught:
        parse_profile(data)
    paths = {i.path for i in caught.value.issues}
    assert paths == {"state.redis_url", "state.on_error"}
    data["state"] = {"redis_url": "redis://cache:sixthousand/0"}
    with pytest.raises(ConfigError, match=r"state\.redis_url: invalid URL"):
        parse_profile(data)
    data["state"] = {"redis_url": "redis://cache:6379", "redis_url_env": "REDIS_URL"}
    with pytest.raises(ConfigError, match="state: set at most one of redis_url and redis_url_env"):
        parse_profile(data)


def test_the_url_may_come_from_the_environment() -> None:
    cfg = StateConfig(redis_url_env="LR_REDIS")
    assert redis_url(cfg, {"LR_REDIS": "redis://:pw@cache:6379/1"}) == "redis://:pw@cache:6379/1"
    with pytest.raises(ValueError, match="LR_REDIS is not set"):
        redis_url(cfg, {})
    assert redis_url(StateConfig(), {}) is None


@pytest.fixture
def shaped() -> Iterator[Callable[..., Any]]:
    def make(**state: Any) -> Any:
        data = profile(["http://127.0.0.1:9"])
        if state:
            data["state"] = state
        return parse_profile(data)

    yield make


async def test_a_reload_keeps_the_shared_state_until_its_section_changes(
    redis: RedisServer, shaped: Callable[..., Any]
) -> None:
    metrics = Metrics()
    first = build_runtime(shaped(redis_url=redis.url, timeout_s=2), metrics)
    same = build_runtime(shaped(redis_url=redis.url, timeout_s=2), metrics, previous=first)
    assert first.shared is not None and same.shared is first.shared
    assert same.rates is first.rates and same.slow_clients is first.slow_clients
    await first.aclose()  # the old runtime drained: the state lives on in the new one
    assert (await same.rates.acquire("k", Limits(rpm=5), 0, 0.0)).recorded

    changed = build_runtime(
        shaped(redis_url=redis.url, timeout_s=2, on_error="closed"), metrics, previous=same
    )
    assert changed.shared is not same.shared and changed.rates is not same.rates
    memory = build_runtime(shaped(), metrics, previous=changed)
    assert memory.shared is None and isinstance(memory.rates, MemoryRateStore)
    assert memory.slow_clients.shared is None
    for runtime in (same, changed, memory):
        await runtime.aclose()


async def _debug_sleep(redis: RedisServer, seconds: float) -> None:
    client = Redis.from_url(redis.url, socket_timeout=seconds + 30)
    try:
        await client.execute_command("DEBUG", "SLEEP", seconds)
    finally:
        await client.aclose()


async def _in_flight(client: Redis, state: SharedState, key: str) -> int:
    return int(await client.zcard(state.key("rate", key, "c")))


async def test_concurrency_slots_redis_charged_after_the_replica_gave_up_are_given_back(
    redis: RedisServer, replicas: Replicas
) -> None:
    """Redis stalls past `timeout_s` while a key's requests ask for slots: the replica lets them
    through uncounted (`on_error: open`), and Redis charges them once the stall ends. Those
    charges are given back by their tokens, well within the lease, so the key is not locked out."""
    state = replicas.open(redis.url, timeout_s=0.3, recheck_s=0.2, lease_s=60)
    store, limits = RedisRateStore(state), Limits(max_concurrency=3)
    assert (await store.acquire("other", limits, 0, 0.0)).recorded  # the scripts are loaded
    stall = asyncio.ensure_future(_debug_sleep(redis, 2.0))
    async with asyncio.timeout(10):
        while await redis.ping():
            await asyncio.sleep(0.01)
    during = await asyncio.gather(*[store.acquire("k", limits, 0, 0.0) for _ in range(3)])
    assert all(v.allowed and not v.recorded for v in during)
    await stall

    # Redis answers again and runs the charges: they are given back, well within the 60 s lease.
    client = redis.client()
    try:
        async with asyncio.timeout(20):
            while await _in_flight(client, state, "k") > 0:
                await asyncio.sleep(0.05)
    finally:
        await client.aclose()
    # Three slots free (requests let through uncounted while the replica waits out `recheck_s`
    # do not count).
    recorded = 0
    async with asyncio.timeout(20):
        while recorded < 3:
            verdict = await store.acquire("k", limits, 0, 0.0)
            assert verdict.allowed, verdict
            recorded += verdict.recorded
            await asyncio.sleep(0 if verdict.recorded else 0.05)
