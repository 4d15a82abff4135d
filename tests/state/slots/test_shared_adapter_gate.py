"""Admission counted in Redis takes a LoRA adapter's requests only on backends holding it, as
the process-local gate does, and a waiting adapter request holds up no other request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router.config.load import parse_profile
from router.fleet.adapters import AdapterNeed
from router.lanes.poolgate import Ticket
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from tests.state.slots.test_shared_gate import CHAT, MAX_P, gate_of, shaped
from tests.support.redisserver import RedisServer


@pytest.fixture
async def pair(redis: RedisServer) -> AsyncIterator[tuple[Runtime, Runtime]]:
    runtimes = [build_runtime(parse_profile(shaped(redis.url)), Metrics()) for _ in range(2)]
    try:
        for rt in runtimes:
            plain, holder = rt.pools["interactive"].backends
            plain.served = frozenset({"fake-model"})
            holder.served = frozenset({"fake-model", "sql"})
        yield runtimes[0], runtimes[1]
    finally:
        for rt in runtimes:
            await rt.aclose()


def sql_ticket(rt: Runtime) -> Ticket:
    t = Ticket(lane=rt.lanes[CHAT], long=False, affinity=None)
    t.for_adapter(AdapterNeed("sql", None, False))
    return t


async def test_both_processes_send_an_adapter_only_to_its_holder_and_others_pass_its_waiter(
    pair: tuple[Runtime, Runtime],
) -> None:
    a, b = pair
    taken = []
    for i in range(MAX_P):  # the holder's prefill room, over both processes
        rt = (a, b)[i % 2]
        t = sql_ticket(rt)
        backend = await gate_of(rt).acquire(t)
        assert backend is rt.pools["interactive"].backends[1]
        taken.append((rt, t))
    waiting = sql_ticket(a)
    queued = asyncio.ensure_future(gate_of(a).acquire(waiting))
    async with asyncio.timeout(5):
        while not gate_of(a).waiting:
            await asyncio.sleep(0.01)
    other = Ticket(lane=a.lanes[CHAT], long=False, affinity=None)
    async with asyncio.timeout(10):
        assert await gate_of(a).acquire(other) is a.pools["interactive"].backends[0]
    rt, first = taken[0]
    gate_of(rt).finish(first)
    async with asyncio.timeout(10):
        assert await queued is a.pools["interactive"].backends[1]
    for rt, t in [*taken[1:], (a, waiting), (a, other)]:
        gate_of(rt).finish(t)
