"""A lane's limit held by two `lane-router serve` replicas together through Redis going away,
stalling and coming back empty: a real redis-server, real router processes, and a backend that
holds every request until the test lets it go and counts how many it holds (tests/support/holdingbackend.py).

The profile splits the chat lane's 4 slots into parts of 2 (`replicas: 2`). Replica A takes all
4 while Redis is there; whatever happens to Redis then, B's requests must not reach the backend
until A's have ended. A tenant key's concurrency slots, held by a replica SIGKILLed, come back
within the lease however often its client retries."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from router.keys.auth import hash_key
from tests.support.holdingbackend import HoldingBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.redisserver import RedisServer, redis_server
from tests.support.scaleout import Router, kill, router, until_exited, write_profile
from tests.support.servers import server_group

LANE = 4
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
WAIT_S = 60.0


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
async def backend() -> AsyncIterator[tuple[HoldingBackend, str]]:
    holding = HoldingBackend()
    async with server_group() as group:
        yield holding, await group.serve(holding)


def two_replicas(backend_url: str, redis_url: str, heartbeat_s: float = 0.2) -> dict[str, Any]:
    data = profile([backend_url])
    data["lanes"]["chat"].update(max_in_flight=LANE, queue_timeout_s=WAIT_S)
    data["pools"]["interactive"]["read_timeout_s"] = WAIT_S
    data["pools"]["interactive"]["response_head_timeout_s"] = WAIT_S
    data["health"] = {"interval_s": 0.5, "timeout_s": 2, "unhealthy_after": 50, "healthy_after": 1}
    data["replicas"] = 2
    data["state"] = {"redis_url": redis_url, "timeout_s": 0.3, "recheck_s": 0.2, "heartbeat_s": heartbeat_s}
    return data


async def served_once(holding: HoldingBackend, r: Router) -> None:
    """One request through `r`, let go at once: the replica has been serving."""
    (one,) = send(r, 1)
    await holding.wait_for(lambda: holding.held == 1, WAIT_S)
    holding.release()
    assert await one == 200


def send(r: Router, n: int) -> list[asyncio.Task[int]]:
    async def one() -> int:
        async with r.client() as http:
            resp = await http.post("/v1/chat/completions", json=BODY, headers=auth("user"))
            return resp.status_code

    return [asyncio.ensure_future(one()) for _ in range(n)]


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.05)


async def lane_in_redis(client: Redis) -> int:
    with contextlib.suppress(RedisError, OSError):
        return int(await client.hget("lane-router:slots:lane:chat", "f") or 0)
    return -1


async def heartbeat_ttl(client: Redis, pid: int) -> int:
    """The remaining lease of the heartbeat of the router process `pid` (-1: none)."""
    found = -1
    async for key in client.scan_iter(match=f"lane-router:slots:hb:*:{pid}:*"):
        found = max(found, int(await client.pttl(key)))
    return found


async def knows_of(client: Redis, b: Router) -> None:
    """Until B's heartbeat ran after A's 4 slots were in Redis: B has seen what A holds."""
    await until(lambda: _equal(lane_in_redis(client), LANE))
    await heartbeat_renewed(client, b.proc.pid)


async def heartbeat_renewed(client: Redis, pid: int) -> None:
    """Until the heartbeat of router process `pid` is renewed. Unrenewed, its remaining lease
    only falls from one reading to the next; a renewal shows as a reading above the one before
    (comparing with the first reading instead would miss a renewal that falls between two
    polls further from the first than the time the first was read after the last renewal)."""
    last = await heartbeat_ttl(client, pid)

    async def risen() -> bool:
        nonlocal last
        now, before = await heartbeat_ttl(client, pid), last
        last = now
        return now > before

    await until(risen)


async def _equal(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def in_router(r: Router, n: int) -> None:
    """Until `n` chat requests are inside router `r` (admitted or waiting)."""

    async def inside() -> bool:
        with contextlib.suppress(httpx.TransportError):
            return await r.total("lane_router_in_flight", lane="chat") == n
        return False

    await until(inside)


async def finish(backend: HoldingBackend, a: list[asyncio.Task[int]], b: list[asyncio.Task[int]]) -> None:
    """Let A's requests end, then B's once they reach the backend; every one is served."""
    backend.release(len(a))
    assert await asyncio.gather(*a) == [200] * len(a)
    await backend.wait_for(lambda: backend.held == len(b), WAIT_S)
    backend.release(len(b))
    assert await asyncio.gather(*b) == [200] * len(b)


@pytest.mark.parametrize("outage", ["killed", "stalled"])
async def test_a_replica_falling_back_to_its_part_counts_what_the_other_holds_beyond_its_own(
    outage: str, tmp_path: Path, redis: RedisServer, backend: tuple[HoldingBackend, str]
) -> None:
    holding, url = backend
    config = write_profile(tmp_path / "p.yaml", two_replicas(url, redis.url))
    client = redis.client()
    stall: asyncio.Task[Any] | None = None
    async with router(config) as a, router(config) as b:
        await served_once(holding, b)
        from_a = send(a, LANE)
        await holding.wait_for(lambda: holding.held == LANE, WAIT_S)
        await knows_of(client, b)
        await until(lambda: _metric_reaches(b, "lane_router_shared_slots_excess", 2, lane="chat"))

        if outage == "killed":
            await redis.stop()
        else:
            stall = asyncio.ensure_future(_debug_sleep(redis, 3.0))
            await until(_not(redis.ping))
        from_b = send(b, 2)
        await in_router(b, 2)
        if stall is not None:
            # B tried Redis during the stall and gave up on it, or the stall is over already.
            await until(lambda: _timed_out_or_over(b, redis))
            await stall
        else:
            # B fell back to its part and said what it cannot know.
            await until(
                lambda: _metric_reaches(b, "lane_router_shared_slots_inexact_total", 1, reason="fallback")
            )
            assert "slots they took since then are not known" in b.log.read_text()
            await redis.start()
        assert holding.held == LANE  # B's part is 2, less the 2 A holds beyond its own
        await finish(holding, from_a, from_b)
    await client.aclose()
    assert holding.peak == LANE


@pytest.mark.parametrize("emptied", ["restarted", "flushed"])
async def test_redis_restarted_empty_grants_nothing_before_every_replica_has_re_homed(
    emptied: str, tmp_path: Path, redis: RedisServer, backend: tuple[HoldingBackend, str]
) -> None:
    holding, url = backend
    config = write_profile(tmp_path / "p.yaml", two_replicas(url, redis.url))
    async with router(config) as a, router(config) as b:
        await served_once(holding, b)
        from_a = send(a, LANE)
        await holding.wait_for(lambda: holding.held == LANE, WAIT_S)
        client = redis.client()
        await knows_of(client, b)
        await client.aclose()

        from_b = send(b, 2)  # waiting for A's slots, asking Redis again and again
        await in_router(b, 2)
        if emptied == "restarted":
            await redis.stop()
            await redis.start()
        else:  # the same, unnoticed by open connections
            client = redis.client()
            await client.flushall()
            await client.aclose()
        client = redis.client()
        # A re-homes its 4 at its next heartbeat; until then B was granted nothing.
        await until(lambda: _equal(lane_in_redis(client), LANE))
        await client.aclose()
        assert holding.held == LANE
        await finish(holding, from_a, from_b)
    assert holding.peak == LANE


async def _metric_reaches(r: Router, name: str, value: float, **labels: str) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return await r.total(name, **labels) >= value
    return False


async def _debug_sleep(redis: RedisServer, seconds: float) -> None:
    client = Redis.from_url(redis.url, socket_timeout=seconds + 30)
    try:
        await client.execute_command("DEBUG", "SLEEP", seconds)
    finally:
        await client.aclose()


def _not(check: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
    async def negated() -> bool:
        return not await check()

    return negated


async def _timed_out_or_over(b: Router, redis: RedisServer) -> bool:
    if await redis.ping():
        return True
    errors = await b.total("lane_router_shared_state_errors_total", reason="timeout")
    return errors > 0


TENANT = "tenant-key-0123456789abcdef"
TENANT_AUTH = {"authorization": f"Bearer {TENANT}"}
LEASE_S = 6.0


def tenant_profile(backend_url: str, redis_url: str) -> dict[str, Any]:
    data = two_replicas(backend_url, redis_url)
    data["keys"].append({"name": "tenant", "sha256": hash_key(TENANT), "max_concurrency": 3})
    data["state"]["lease_s"] = LEASE_S
    return data


async def as_tenant(r: Router) -> httpx.Response:
    async with r.client() as http:
        return await http.post("/v1/chat/completions", json=BODY, headers=TENANT_AUTH)


async def test_a_tenants_slots_held_by_a_killed_replica_come_back_within_the_lease_despite_retries(
    tmp_path: Path, redis: RedisServer, backend: tuple[HoldingBackend, str]
) -> None:
    """A replica SIGKILLed while a key holds all 3 of its concurrency slots: the key's client,
    retrying through the other replica as each refusal's Retry-After says, is served again once
    the dead replica's leases ran out; its refused retries renew nothing."""
    holding, url = backend
    config = write_profile(tmp_path / "p.yaml", tenant_profile(url, redis.url))
    async with router(config) as a, router(config) as b:
        doomed = [asyncio.ensure_future(as_tenant(a)) for _ in range(3)]
        await holding.wait_for(lambda: holding.held == 3, WAIT_S)
        refused = await as_tenant(b)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_concurrency"

        arrived = len(holding.connections)
        # The retries begin at once: the lease (LEASE_S) leaves them seconds of refusals to
        # renew it with, however slowly this machine reaps the dead replica.
        kill(a.proc.pid)
        killed_at = time.monotonic()
        retries = 0
        async with asyncio.timeout(WAIT_S):
            while True:
                attempt = asyncio.ensure_future(as_tenant(b))
                reached = asyncio.ensure_future(
                    holding.wait_for(lambda: len(holding.connections) > arrived, WAIT_S)
                )
                await asyncio.wait([attempt, reached], return_when=asyncio.FIRST_COMPLETED)
                if reached.done():
                    break
                reached.cancel()
                response = attempt.result()
                assert response.status_code == 429, response.text
                retries += 1
                await asyncio.sleep(float(response.headers["retry-after"]))  # as the client is told
        served_after = time.monotonic() - killed_at
        holding.release(holding.held)
        assert (await attempt).status_code == 200
        await asyncio.gather(*doomed, return_exceptions=True)
        await until_exited(a.proc.pid)
    assert retries >= 1  # refused while the dead replica's leases ran
    # Its leases were last renewed at most a third of a lease before it died.
    assert served_after <= LEASE_S + 1.0 + 10.0


async def test_a_take_beyond_a_part_is_known_to_the_other_replica_before_any_heartbeat(
    tmp_path: Path, redis: RedisServer, backend: tuple[HoldingBackend, str]
) -> None:
    """Heartbeats far apart: B learns that A holds 2 beyond its part from A's takes themselves,
    and keeps clear of them when Redis is killed right after."""
    holding, url = backend
    config = write_profile(tmp_path / "p.yaml", two_replicas(url, redis.url, heartbeat_s=30))
    async with router(config) as a, router(config) as b:
        await served_once(holding, b)
        from_a = send(a, LANE)
        await holding.wait_for(lambda: holding.held == LANE, WAIT_S)
        await until(lambda: _metric_reaches(b, "lane_router_shared_slots_excess", 2, lane="chat"))

        await redis.stop()
        from_b = send(b, 2)
        await in_router(b, 2)
        await until(
            lambda: _metric_reaches(b, "lane_router_shared_slots_inexact_total", 1, reason="fallback")
        )
        assert holding.held == LANE
        holding.release(LANE)  # A's end while Redis is away: B cannot know, and waits
        assert await asyncio.gather(*from_a) == [200] * LANE
        await redis.start()  # B shares again and finds the lane free
        await holding.wait_for(lambda: holding.held == 2, WAIT_S)
        holding.release(2)
        assert await asyncio.gather(*from_b) == [200] * 2
    assert holding.peak == LANE


async def awaited_runs(client: Redis) -> set[str]:
    """The runs a Redis that lost its data still waits for before granting a slot."""
    with contextlib.suppress(RedisError, OSError):
        return {m.decode() for m in await client.smembers("lane-router:slots:expect")}
    return set()


async def has_epoch(client: Redis) -> bool:
    with contextlib.suppress(RedisError, OSError):
        return bool(await client.exists("lane-router:slots:epoch"))
    return False


# Two Redis restarts, each awaiting a heartbeat 8 s apart: slow on a busy machine.
@pytest.mark.timeout(300)
async def test_redis_restarted_empty_twice_still_awaits_the_replica_that_has_not_re_homed(
    tmp_path: Path, redis: RedisServer, backend: tuple[HoldingBackend, str]
) -> None:
    """B holds the lane's 4 slots and is paused (SIGSTOP) while Redis restarts empty twice: A
    re-homes into the first Redis, which awaits B, and beats there (where only A is alive); the
    second Redis must await B all the same (granting nothing before B has re-homed), and A's
    request then waits for B's slots."""
    holding, url = backend
    # An epoch awaits B for one holder lease (LEASE_BEATS heartbeats) from its creation; past
    # it B counts as dead, as its holder would anyway. Heartbeats 8 s apart give the second
    # restart a 40 s window, which a busy machine's Redis restarts and beats stay within.
    config = write_profile(tmp_path / "p.yaml", two_replicas(url, redis.url, heartbeat_s=8.0))
    async with router(config) as a, router(config) as b:
        await served_once(holding, a)
        from_b = send(b, LANE)
        await holding.wait_for(lambda: holding.held == LANE, WAIT_S)
        client = redis.client()
        await knows_of(client, a)  # A's last heartbeat saw B alive
        await client.aclose()
        b_run = f":{b.proc.pid}:"
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            for restart in range(2):
                awaited = await restarted_empty(redis, a)
                assert any(b_run in run for run in awaited), (restart, awaited)
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        client = redis.client()
        await until(lambda: _equal(lane_in_redis(client), LANE))  # B re-homed its 4
        await client.aclose()
        from_a = send(a, 1)
        await in_router(a, 1)
        assert holding.held == LANE
        await finish(holding, from_b, from_a)
    assert holding.peak == LANE


async def restarted_empty(redis: RedisServer, a: Router) -> set[str]:
    """Redis restarted empty; once A has re-homed into it and beaten there, the runs it awaits."""
    await redis.stop()
    await redis.start()
    client = redis.client()
    try:
        await until(lambda: has_epoch(client))
        awaited = await awaited_runs(client)
        await heartbeat_renewed(client, a.proc.pid)
        return awaited
    finally:
        await client.aclose()
