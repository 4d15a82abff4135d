"""The Retry-After a lane's queue answers with: the requests ahead of the refused one in the
order the queue offers room (its place, not the whole queue), times the lane's measured drain
interval, bounded to [1 s, queue_timeout_s]; with no backend to wait for, the health rounds
a backend needs to come back. The lane's measure is set as a lane that drained at
that pace and has had no completion since it last went idle (router/lanes/drain.py), so the
answer does not depend on when the test runs."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.config.load import parse_profile
from router.errors import Unavailable
from router.fleet.backend import Backend, Health
from router.fleet.health import note_schedule
from router.keys.tenant import Tenant
from router.lanes.poolgate import PoolGate, Ticket
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from tests.lanes.test_poolgate import CHAT, gate_of, make_runtime
from tests.support.profiles import profile

FLOOD, VIP = Tenant("flood"), Tenant("vip", tier=1)


def paced(rt: Runtime, interval_s: float) -> None:
    drain = rt.lanes[CHAT].drain
    drain.interval_s = interval_s
    drain.last = -1.0


def of(rt: Runtime, tenant: Tenant) -> Ticket:
    t = Ticket(lane=rt.lanes[CHAT], long=False, affinity=None)
    t.tenant = tenant
    return t


async def queue(gate: PoolGate, t: Ticket) -> asyncio.Task[Backend]:
    task = asyncio.ensure_future(gate.acquire(t))
    await asyncio.sleep(0)  # let it reach the queue
    return task


async def refusal(gate: PoolGate, t: Ticket) -> Unavailable:
    with pytest.raises(Unavailable) as caught:
        await gate.acquire(t)
    return caught.value


async def tiered(interval_s: float, timeout_s: float = 60.0) -> tuple[Runtime, list[asyncio.Task[Backend]]]:
    """A lane of 1 slot, held by the flood, whose queue of 4 holds 2 of the flood's requests
    and 2 of a key of a higher tier."""
    rt = make_runtime(chat={"max_in_flight": 1, "queue_limit": 4, "queue_timeout_s": timeout_s})
    gate = gate_of(rt)
    await gate.acquire(of(rt, FLOOD))
    tasks = [await queue(gate, of(rt, k)) for k in (FLOOD, FLOOD, VIP, VIP)]
    assert rt.lanes[CHAT].waiting == 4
    paced(rt, interval_s)
    return rt, tasks


async def test_a_refused_request_is_told_the_wait_for_its_own_place_at_the_drain_rate() -> None:
    rt, tasks = await tiered(2.0)
    gate = gate_of(rt)

    # The higher tier's next request would wait behind its 2, not the flood's: 3 turns of 2 s.
    vip = await refusal(gate, of(rt, VIP))
    assert vip.code == "queue_full" and vip.retry_after == 6.0
    # The flood's would wait behind all 4.
    flood = await refusal(gate, of(rt, FLOOD))
    assert flood.code == "queue_full" and flood.retry_after == 10.0
    for task in tasks:
        task.cancel()


async def test_a_fast_queue_answers_one_second_and_a_slow_one_at_most_its_timeout() -> None:
    rt, tasks = await tiered(0.05, timeout_s=7.0)
    gate = gate_of(rt)
    assert (await refusal(gate, of(rt, FLOOD))).retry_after == 1.0

    paced(rt, 3.0)  # 5 turns of 3 s: more than the lane's queue timeout
    assert (await refusal(gate, of(rt, FLOOD))).retry_after == 7.0
    for task in tasks:
        task.cancel()


async def test_a_waiter_whose_place_goes_to_another_key_is_told_its_place() -> None:
    rt = make_runtime(chat={"max_in_flight": 1, "queue_limit": 4, "queue_timeout_s": 60})
    gate = gate_of(rt)
    await gate.acquire(of(rt, FLOOD))
    vip = await queue(gate, of(rt, VIP))
    floods = [await queue(gate, of(rt, FLOOD)) for _ in range(3)]
    paced(rt, 2.0)

    # A key with no place takes the flood's newest: behind the higher tier's one and the
    # flood's 2 before it, its turn was the 4th.
    quiet = await queue(gate, of(rt, Tenant("quiet")))
    with pytest.raises(Unavailable) as caught:
        await floods[-1]
    assert caught.value.code == "queue_full" and caught.value.retry_after == 8.0
    for task in [vip, *floods[:-1], quiet]:
        task.cancel()


async def test_a_waiter_past_the_deadline_is_told_the_wait_for_its_place() -> None:
    rt = make_runtime(chat={"max_in_flight": 1, "queue_timeout_s": 0.05})
    gate = gate_of(rt)
    await gate.acquire(of(rt, FLOOD))
    paced(rt, 0.01)

    timed_out = await refusal(gate, of(rt, FLOOD))
    assert timed_out.code == "queue_timeout" and timed_out.retry_after == 1.0


def down_runtime(interval_s: float, healthy_after: int, timeout_s: float = 60.0) -> Runtime:
    data = profile(["http://127.0.0.1:9100"])
    data["health"] = {"interval_s": interval_s, "healthy_after": healthy_after}
    data["lanes"]["chat"]["queue_timeout_s"] = timeout_s
    rt = build_runtime(parse_profile(data), Metrics())
    for backend in rt.pools["interactive"].backends:
        backend.health = Health.DOWN
    note_schedule(rt, time.monotonic())  # as the health checker does after each round
    return rt


async def test_no_healthy_backend_is_told_the_health_rounds_a_backend_needs_to_come_back() -> None:
    # The next round in 3 s, and a second healthy probe 3 s later.
    rt = down_runtime(3.0, 2)
    refused = await refusal(gate_of(rt), of(rt, FLOOD))
    assert refused.status == 503 and refused.retry_after is not None
    assert 5.0 <= refused.retry_after <= 6.0  # less what passed since the round

    soon = down_runtime(0.2, 1)
    assert (await refusal(gate_of(soon), of(soon, FLOOD))).retry_after == 1.0

    far = down_runtime(10.0, 2, timeout_s=12.0)
    assert (await refusal(gate_of(far), of(far, FLOOD))).retry_after == 12.0
