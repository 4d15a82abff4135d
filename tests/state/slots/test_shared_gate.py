"""Admission counted in Redis by two router processes' runtimes (built side by side here, each
with its own connection pool, metrics and holder) in front of the same backends: the limits hold
for both together, a slot freed by one wakes the other's waiter, and Redis going away, coming
back empty or losing a holder leaves the counts exact again."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.errors import Unavailable
from router.lanes.poolgate import Ticket
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from router.state.slots import gate as gate_module
from router.state.slots import store as store_module
from router.state.slots.gate import SharedPoolGate
from tests.support.profiles import profile
from tests.support.redisserver import RedisServer

CHAT, AGENT = RequestClass.CHAT, RequestClass.AGENT
BACKENDS = [f"http://127.0.0.1:{9100 + i}" for i in range(2)]
MAX_P, MAX_L, LANE = 3, 1, 4


def shaped(url: str, **state: Any) -> dict[str, Any]:
    data = profile(BACKENDS)
    data["pools"]["interactive"]["admission"] = {"max_prefilling": MAX_P, "max_long_prefilling": MAX_L}
    data["lanes"]["chat"].update(max_in_flight=LANE, queue_timeout_s=10)
    data["lanes"]["agent"]["queue_timeout_s"] = 10
    data["replicas"] = 2
    data["state"] = {"redis_url": url, "timeout_s": 2, "recheck_s": 0.2, **state}
    return data


Pair = tuple[Runtime, Runtime]


@pytest.fixture
async def pair(redis: RedisServer) -> AsyncIterator[Pair]:
    runtimes = [build_runtime(parse_profile(shaped(redis.url)), Metrics()) for _ in range(2)]
    try:
        yield runtimes[0], runtimes[1]
    finally:
        for rt in runtimes:
            await rt.aclose()


def gate_of(rt: Runtime) -> SharedPoolGate:
    gate = rt.pools["interactive"].gate
    assert isinstance(gate, SharedPoolGate)
    return gate


def ticket(rt: Runtime, cls: RequestClass = CHAT, long: bool = False) -> Ticket:
    return Ticket(lane=rt.lanes[cls], long=long, affinity=None)


def own(rts: Sequence[Runtime]) -> dict[str, int]:
    """What both processes hold, summed over them: the truth Redis must agree with."""
    backends = [b for rt in rts for b in rt.pools["interactive"].backends]
    return {
        "lane": sum(rt.lanes[CHAT].in_flight for rt in rts),
        "p": sum(b.prefilling for b in backends),
        "l": sum(b.long_prefilling for b in backends),
        "f": sum(b.in_flight for b in backends),
    }


async def in_redis(client: Redis) -> dict[str, int]:
    keys = [k.decode() async for k in client.scan_iter(match="lane-router:slots:b:*")]
    totals = {"lane": int(await client.hget("lane-router:slots:lane:chat", "f") or 0)}
    for counter in "fpl":
        totals[counter] = sum([int(await client.hget(k, counter) or 0) for k in keys])
    return totals


async def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.02)


def errors(rt: Runtime, op: str, reason: str) -> float:
    labels = {"op": op, "reason": reason}
    return rt.metrics.registry.get_sample_value("lane_router_shared_state_errors_total", labels) or 0.0


async def test_random_traffic_through_two_processes_keeps_every_limit_together(
    pair: Pair, redis: RedisServer
) -> None:
    rng = random.Random(3)
    violations: list[str] = []

    def check() -> None:
        for name in BACKENDS:
            held = [b for rt in pair for b in rt.pools["interactive"].backends if b.name == name]
            prefilling, long = sum(b.prefilling for b in held), sum(b.long_prefilling for b in held)
            if prefilling > MAX_P or long > MAX_L:
                violations.append(f"{name}: {prefilling}/{long}")
        if own(pair)["lane"] > LANE:
            violations.append(f"lane: {own(pair)['lane']}")

    async def one() -> None:
        await asyncio.sleep(rng.random() * 0.1)
        rt = rng.choice(pair)
        t = ticket(rt, rng.choice([CHAT, CHAT, AGENT]), long=rng.random() < 0.4)
        gate = gate_of(rt)
        try:
            await gate.acquire(t)
            check()
            await asyncio.sleep(rng.random() * 0.02)
            gate.end_prefill(t)
            await asyncio.sleep(rng.random() * 0.02)
        except Unavailable:
            pass
        finally:
            gate.finish(t)

    tasks = [asyncio.ensure_future(one()) for _ in range(120)]
    await asyncio.sleep(0.05)
    for task in rng.sample(tasks, 10):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    assert violations == []
    assert own(pair) == {"lane": 0, "p": 0, "l": 0, "f": 0}
    client = redis.client()
    try:
        await until(lambda: _equal(client, {"lane": 0, "f": 0, "p": 0, "l": 0}))
    finally:
        await client.aclose()


async def _equal(client: Redis, expected: dict[str, int]) -> bool:
    return await in_redis(client) == expected


async def test_a_slot_freed_by_the_other_process_wakes_the_waiter_at_once(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate_module, "RECHECK_S", 60.0)  # only the news of the release can wake it
    a, b = pair
    held = [ticket(a) for _ in range(LANE)]
    for t in held:
        await gate_of(a).acquire(t)
        gate_of(a).end_prefill(t)
    waiting = asyncio.ensure_future(gate_of(b).acquire(ticket(b)))
    await until(lambda: _true(gate_of(b).waiting == 1))
    await asyncio.sleep(0.1)  # time for b's subscription; the test holds without it too
    assert not waiting.done()

    gate_of(a).finish(held[0])

    await asyncio.wait_for(waiting, 5)
    assert b.lanes[CHAT].in_flight == 1
    for t in held[1:]:
        gate_of(a).finish(t)


async def _true(value: bool) -> bool:
    return value


async def test_redis_away_means_each_process_keeps_to_its_part_and_back_means_exact_counts(
    pair: Pair, redis: RedisServer
) -> None:
    a, b = pair
    first = ticket(a)
    await gate_of(a).acquire(first)  # counted in Redis

    await redis.stop()
    held = [first]
    # replicas: 2, so each process's part of the lane's 4 slots is 2: one more here.
    second = ticket(a)
    assert await asyncio.wait_for(gate_of(a).acquire(second), 5) is not None
    held.append(second)
    third_ticket = ticket(a)
    third = asyncio.ensure_future(gate_of(a).acquire(third_ticket))
    await until(lambda: _true(gate_of(a).waiting == 1))
    assert not third.done()
    assert errors(a, "slot_take", "connection") + errors(a, "slot_release", "connection") >= 1
    assert errors(a, "slot_take", "backoff") >= 1  # admissions counted locally are counted

    await redis.start()  # empty: everything it knew is lost
    b_ticket = ticket(b)
    await asyncio.wait_for(gate_of(b).acquire(b_ticket), 5)  # b re-homes on its first admission
    client = redis.client()
    try:
        gate_of(a).finish(held.pop())
        await asyncio.wait_for(third, 10)
        held.append(third_ticket)
        expected = own(pair)
        # a re-homes on its next admission or heartbeat, whichever comes first.
        await until(lambda: _equal(client, expected))
        assert gate_of(a).store.shared_now()
    finally:
        await client.aclose()
    for t in held:
        gate_of(a).finish(t)
    gate_of(b).finish(b_ticket)


async def test_slots_of_a_process_that_stopped_beating_come_back_after_the_lease(
    redis: RedisServer,
) -> None:
    dead = build_runtime(parse_profile(shaped(redis.url, heartbeat_s=0.2)), Metrics())
    alive = build_runtime(parse_profile(shaped(redis.url, heartbeat_s=0.2)), Metrics())
    try:
        for _ in range(LANE):
            await gate_of(dead).acquire(ticket(dead))
        store = gate_of(dead).store
        for task in list(store._tasks):  # it dies holding its slots: no heartbeat, no release
            task.cancel()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(gate_of(alive).acquire(ticket(alive)), 5)
        assert loop.time() - began >= 0.5  # held until the lease ran out, not given back early
    finally:
        store.mode = store_module.Mode.LOCAL  # so closing it gives nothing back
        await dead.aclose()
        await alive.aclose()


async def test_a_holder_redis_forgot_re_homes_what_it_holds(pair: Pair, redis: RedisServer) -> None:
    a, _ = pair
    held = [ticket(a, long=True), ticket(a)]
    for t in held:
        await gate_of(a).acquire(t)
    client = redis.client()
    try:
        await client.flushall()  # a restart without persistence, unnoticed by open connections
        expected = own(pair)
        await until(lambda: _equal(client, expected))  # the heartbeat notices and re-homes
    finally:
        await client.aclose()
    for t in held:
        gate_of(a).finish(t)


async def test_a_process_whose_holder_was_dropped_while_it_held_requests_says_how_many(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Its heartbeat gone (a pause past the lease): its slots may have been granted again, and
    the warning counts its requests (each holds a lane's slot and a backend's, counted once)."""
    rt = build_runtime(parse_profile(shaped(redis.url, heartbeat_s=0.2)), Metrics())
    held = [ticket(rt), ticket(rt, long=True)]
    client = redis.client()
    try:
        for t in held:
            await gate_of(rt).acquire(t)
        await client.delete(*[k async for k in client.scan_iter(match="lane-router:slots:hb:*")])

        def late() -> float:
            labels = {"reason": "late_rehome"}
            return rt.metrics.registry.get_sample_value("lane_router_shared_slots_inexact_total", labels) or 0

        await until(lambda: _true(late() == 1))
        assert "re-homed 2 request(s) it holds into Redis after its holder was dropped" in caplog.text
    finally:
        for t in held:
            gate_of(rt).finish(t)
        await client.aclose()
        await rt.aclose()


async def test_a_process_killed_while_redis_was_away_delays_grants_for_a_lease_at_most(
    redis: RedisServer,
) -> None:
    """Three processes; one dies while Redis is away, and Redis comes back empty. The new epoch
    awaits the dead one too: no slot is granted before its lease has passed (it might have been
    alive, holding), and then the lane is the survivors' again, never beyond its limit."""
    rts = [build_runtime(parse_profile(shaped(redis.url, heartbeat_s=0.2)), Metrics()) for _ in range(3)]
    alive, other, dead = rts
    store = gate_of(dead).store
    client = redis.client()
    try:
        held = {rt: [ticket(rt), ticket(rt)] for rt in (alive, dead)}
        for rt, tickets in held.items():
            for t in tickets:
                await gate_of(rt).acquire(t)
        await until(lambda: _true(all(_sees_the_others(rt, rts) for rt in rts)))

        await redis.stop()
        for task in list(store._tasks):  # SIGKILLed: it never beats nor re-homes again
            task.cancel()
        await redis.start()  # empty
        late = ticket(other)
        await asyncio.wait_for(gate_of(other).acquire(late), 10)
        now_s, now_us = await client.time()
        settled = int(await client.hget("lane-router:slots:epoch", "until") or 0)
        assert now_s * 1000 + now_us // 1000 >= settled  # granted once the lease had passed
        assert int(await client.hget("lane-router:slots:lane:chat", "f") or 0) == 3  # alive's 2 + 1
        gate_of(other).finish(late)
        for t in held[alive]:
            gate_of(alive).finish(t)
    finally:
        store.mode = store_module.Mode.LOCAL
        await client.aclose()
        for rt in rts:
            await rt.aclose()


def _sees_the_others(rt: Runtime, rts: list[Runtime]) -> bool:
    """Whether `rt`'s last heartbeat found the other processes alive."""
    store = gate_of(rt).store
    return set(store._peers) == {gate_of(r).store.run for r in rts} - {store.run}


async def test_a_take_redis_runs_after_the_process_gave_up_on_it_is_not_counted_twice(
    redis: RedisServer,
) -> None:
    """Redis stalls with a take queued: the process gives up on it and counts locally, Redis then
    charges it anyway; the re-homing drops it, so Redis holds what the process holds."""
    # Heartbeats far apart: the take is what meets the stall.
    rt = build_runtime(parse_profile(shaped(redis.url, timeout_s=0.3, heartbeat_s=5.0)), Metrics())
    client = redis.client()
    held = [ticket(rt)]
    try:
        await gate_of(rt).acquire(held[0])
        stall = asyncio.ensure_future(_stall(redis, 1.5))
        await until(lambda: _stalled(redis))
        held.append(ticket(rt))
        await asyncio.wait_for(gate_of(rt).acquire(held[1]), 10)  # gave up on Redis: counted locally
        assert errors(rt, "slot_take", "timeout") == 1
        await stall
        await until(lambda: _equal(client, own([rt])), 10)
    finally:
        for t in held:
            gate_of(rt).finish(t)
        await client.aclose()
        await rt.aclose()


async def _stall(redis: RedisServer, seconds: float) -> None:
    client = Redis.from_url(redis.url, socket_timeout=seconds + 30)
    try:
        await client.execute_command("DEBUG", "SLEEP", seconds)
    finally:
        await client.aclose()


async def _stalled(redis: RedisServer) -> bool:
    return not await redis.ping()


async def test_a_process_whose_subscription_was_cut_hears_takes_beyond_a_part_again(
    redis: RedisServer,
) -> None:
    """Redis closes the subscribers' connections (an output buffer limit, a proxy, a blip): each
    process subscribes again, and still learns at once what the other takes beyond its part."""
    rts = [build_runtime(parse_profile(shaped(redis.url, heartbeat_s=30.0)), Metrics()) for _ in range(2)]
    a, b = rts
    client = redis.client()
    over = "lane-router:slots:over"
    held: list[Ticket] = []
    try:
        for rt in rts:
            gate_of(rt).store.start()
        await until(lambda: _subscribers(client, over, 2))
        cut = await _subscriber_ids(client)
        await client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")

        async def again() -> bool:
            ids = await _subscriber_ids(client)
            return len(ids) == 2 and not ids & cut and await _subscribers(client, over, 2)

        await until(again)
        for _ in range(LANE - 1):  # a's part is 2: one beyond it
            held.append(ticket(a))
            await gate_of(a).acquire(held[-1])
        await until(lambda: _true(gate_of(b).store.excess(b.lanes[CHAT]) >= 1))
    finally:
        for t in held:
            gate_of(a).finish(t)
        await client.aclose()
        for rt in rts:
            await rt.aclose()


async def _subscribers(client: Redis, channel: str, n: int) -> bool:
    found = dict(await client.pubsub_numsub(channel))
    return int(found.get(channel.encode(), 0)) >= n


async def _subscriber_ids(client: Redis) -> set[str]:
    return {str(c["id"]) for c in await client.client_list(_type="pubsub")}
