"""A full Redis, as the deployment runs it (`lane-router render`'s arguments, with a smaller
memory cap): whatever else fills it, it never forgets the heartbeat of a process that holds
slots, for a holder without one is dropped by the next heartbeat of any process and its slots
granted again while its requests still run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from router.config.load import parse_profile
from router.deploy.plan import REDIS_ARGS
from router.observe.metrics import Metrics
from router.state.runtime import build_runtime
from tests.state.slots.test_shared_gate import gate_of, shaped, ticket
from tests.support.redisserver import RedisServer, redis_server

CAP = "4mb"
VALUE = b"x" * 4096
ENOUGH = 4000  # keys of VALUE: four times the cap


@pytest.fixture
async def deployed(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path, [*REDIS_ARGS, "--maxmemory", CAP]) as server:
        yield server


async def heartbeats(client: Redis) -> list[bytes]:
    return [k async for k in client.scan_iter(match="lane-router:slots:hb:*")]


async def fill(client: Redis) -> None:
    """Keys that outlive a heartbeat's lease (slow-client marks, response ids: anything), until
    Redis refuses more or holds four times its cap."""
    for i in range(ENOUGH):
        try:
            await client.set(f"lane-router:other:{i}", VALUE, px=600_000)
        except RedisError:
            return


async def test_a_full_redis_keeps_the_heartbeat_of_a_process_holding_slots(deployed: RedisServer) -> None:
    rt = build_runtime(parse_profile(shaped(deployed.url, heartbeat_s=2.0)), Metrics())
    client = deployed.client()
    held = ticket(rt)
    try:
        await gate_of(rt).acquire(held)
        assert gate_of(rt).store.shared_now() and len(await heartbeats(client)) == 1
        await fill(client)
        assert len(await heartbeats(client)) == 1
        assert int(await client.hget("lane-router:slots:lane:chat", "f") or 0) == 1
    finally:
        gate_of(rt).finish(held)
        await client.aclose()
        await rt.aclose()
