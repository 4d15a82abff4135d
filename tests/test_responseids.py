"""The memory of which backend holds each response id: its TTL and size cap, and its Redis copy
shared by replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.config.models import RequestClass, ResponseIdsConfig, StateConfig
from router.metrics import Metrics
from router.responseids import Holder, ResponseIds
from router.sharedstate import SharedState
from tests.redisserver import RedisServer, redis_server

HOLDER = Holder("web", "interactive", "http://10.0.0.1:8000", RequestClass.CHAT, 120)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_an_id_is_forgotten_after_its_ttl() -> None:
    clock = Clock()
    ids = ResponseIds(ResponseIdsConfig(ttl_s=10, max_entries=16), clock=clock)
    ids.remember("resp_a", HOLDER)
    clock.now = 9.9
    assert await ids.recall("resp_a") == HOLDER
    clock.now = 10.0
    assert await ids.recall("resp_a") is None
    assert len(ids) == 0


async def test_the_oldest_ids_go_first_past_the_cap() -> None:
    clock = Clock()
    ids = ResponseIds(ResponseIdsConfig(ttl_s=100, max_entries=16), clock=clock)
    for i in range(20):
        clock.now = i
        ids.remember(f"resp_{i}", HOLDER)
    assert len(ids) == 16
    assert await ids.recall("resp_3") is None
    assert await ids.recall("resp_4") == HOLDER


def test_a_holder_survives_its_encoding_and_garbage_is_no_holder() -> None:
    assert Holder.decode(HOLDER.encode()) == HOLDER
    assert Holder.decode(b"[1,2]") is None
    assert Holder.decode(b'["k","p","b","nope",1]') is None


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


async def test_replicas_share_ids_through_redis_and_a_dead_redis_is_a_counted_miss(
    redis: RedisServer,
) -> None:
    metrics = [Metrics(), Metrics()]
    states = [SharedState(StateConfig(redis_url=redis.url, timeout_s=2.0), redis.url, m) for m in metrics]
    try:
        a, b = (ResponseIds(ResponseIdsConfig(ttl_s=60), s) for s in states)
        a.remember("resp_shared", HOLDER)
        await states[0].release()  # waits for the background write
        states = states[1:]
        assert await b.recall("resp_shared") == HOLDER
        assert 0 < await redis.client().pttl("lane-router:resp:resp_shared") <= 60_000
        await redis.stop()
        assert await b.recall("resp_other") is None
        labels = {"op": "response_lookup", "reason": "connection"}
        assert metrics[1].registry.get_sample_value("lane_router_shared_state_errors_total", labels) == 1.0
    finally:
        for state in states:
            await state.release()
