"""Fairness across keys with counts shared in Redis: each process orders its own waiters, as a
process alone does (router/lanes/fairqueue.py), and grants the slots Redis gives it in that
order. Two runtimes side by side, as in tests/state/slots/test_shared_gate.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router.config.load import parse_profile
from router.fleet.backend import Backend
from router.keys.tenant import Tenant
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from tests.state.slots.test_shared_gate import LANE, gate_of, shaped, ticket
from tests.support.redisserver import RedisServer

FLOOD, QUIET = Tenant("flood"), Tenant("quiet")


@pytest.fixture
async def runtimes(redis: RedisServer) -> AsyncIterator[tuple[Runtime, Runtime]]:
    rts = [build_runtime(parse_profile(shaped(redis.url)), Metrics()) for _ in range(2)]
    try:
        yield rts[0], rts[1]
    finally:
        for rt in rts:
            await rt.aclose()


async def test_a_quiet_key_goes_ahead_of_a_flood_waiting_in_the_same_process(
    runtimes: tuple[Runtime, Runtime],
) -> None:
    rt, other = runtimes
    gate = gate_of(rt)
    held = [ticket(rt) for _ in range(LANE)]
    for t in held:
        t.tenant = FLOOD
        await gate.acquire(t)  # with Redis there, one process may take the whole lane
    flood = [ticket(rt) for _ in range(6)]
    quiet = ticket(rt)
    quiet.tenant = QUIET
    for t in flood:
        t.tenant = FLOOD
    tasks: dict[asyncio.Task[Backend], str] = {}
    for t in [*flood, quiet]:
        tasks[asyncio.ensure_future(gate.acquire(t))] = t.tenant.name
        async with asyncio.timeout(10):
            while rt.lanes[t.lane.cls].waiting < len(tasks):
                await asyncio.sleep(0.005)
    assert gate_of(other).waiting == 0

    granted: list[str] = []
    for t in held[:2]:  # each slot freed reaches Redis, then this process's next waiter
        gate.end_prefill(t)
        gate.finish(t)
        done, _ = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        (task,) = done
        granted.append(tasks.pop(task))
    # The first slot freed: the flood holds the whole lane, the quiet key nothing.
    assert granted[0] == QUIET.name

    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
