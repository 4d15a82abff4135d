"""Admission with waiting: lane limits, prefill limits, priority order, deadlines, hand-off."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.errors import Unavailable
from router.fleet.backend import Backend, Health
from router.lanes.lane import Lane
from router.lanes.poolgate import PoolGate, Ticket
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from tests.support.profiles import profile

CHAT, BATCH, AGENT = RequestClass.CHAT, RequestClass.BATCH, RequestClass.AGENT


def make_runtime(
    n_backends: int = 1, admission: dict[str, Any] | None = None, **lanes: dict[str, Any]
) -> Runtime:
    data = profile([f"http://127.0.0.1:{9100 + i}" for i in range(n_backends)])
    data["pools"]["interactive"]["admission"] = admission or {}
    for cls, extra in lanes.items():
        data["lanes"][cls].update(extra)
    return build_runtime(parse_profile(data), Metrics())


def gate_of(rt: Runtime) -> PoolGate:
    return rt.pools["interactive"].gate


def ticket(rt: Runtime, cls: RequestClass = CHAT, long: bool = False) -> Ticket:
    return Ticket(lane=rt.lanes[cls], long=long, affinity=None)


async def start(gate: PoolGate, t: Ticket) -> asyncio.Task[Backend]:
    task = asyncio.ensure_future(gate.acquire(t))
    await asyncio.sleep(0)  # let it reach the queue
    return task


def totals(rt: Runtime) -> tuple[int, int, int, int, int]:
    backends = rt.pools["interactive"].backends
    return (
        sum(lane.in_flight for lane in rt.lanes.values()),
        sum(b.in_flight for b in backends),
        sum(b.prefilling for b in backends),
        sum(b.long_prefilling for b in backends),
        sum(lane.waiting for lane in rt.lanes.values()),
    )


async def test_a_free_slot_is_taken_at_once_and_given_back_whole() -> None:
    rt = make_runtime(admission={"max_prefilling": 2, "max_long_prefilling": 1})
    gate = gate_of(rt)
    t = ticket(rt, long=True)

    backend = await gate.acquire(t)

    assert t.backend is backend and t.holds_lane and t.prefilling
    assert totals(rt) == (1, 1, 1, 1, 0)
    gate.end_prefill(t)
    assert totals(rt) == (1, 1, 0, 0, 0)
    gate.finish(t)
    assert totals(rt) == (0, 0, 0, 0, 0)
    gate.finish(t)  # idempotent
    assert totals(rt) == (0, 0, 0, 0, 0)


async def test_lane_max_in_flight_makes_the_next_request_wait_for_a_finish() -> None:
    rt = make_runtime(chat={"max_in_flight": 1})
    gate = gate_of(rt)
    first, second = ticket(rt), ticket(rt)
    await gate.acquire(first)

    waiting = await start(gate, second)
    assert not waiting.done() and rt.lanes[CHAT].waiting == 1

    gate.finish(first)
    assert (await waiting) is second.backend
    assert rt.lanes[CHAT].in_flight == 1 and rt.lanes[CHAT].waiting == 0


async def test_other_lanes_are_not_held_up_by_a_full_lane() -> None:
    rt = make_runtime(chat={"max_in_flight": 1})
    gate = gate_of(rt)
    await gate.acquire(ticket(rt))
    blocked = await start(gate, ticket(rt))

    # A waiter exists, so the agent request goes through the queue, and past the blocked chat one.
    agent = await asyncio.wait_for(gate.acquire(ticket(rt, AGENT)), 1)

    assert agent is not None and not blocked.done()
    blocked.cancel()


async def test_first_token_frees_a_prefill_slot_for_the_next_request() -> None:
    rt = make_runtime(admission={"max_prefilling": 1})
    gate = gate_of(rt)
    first = ticket(rt)
    await gate.acquire(first)
    waiting = await start(gate, ticket(rt))
    assert not waiting.done()

    gate.end_prefill(first)  # still in flight, but no longer prefilling

    await asyncio.wait_for(waiting, 1)
    assert totals(rt)[:3] == (2, 2, 1)


async def test_waiters_go_in_lane_priority_order_then_fifo() -> None:
    rt = make_runtime(admission={"max_prefilling": 1}, batch={"priority": 9}, chat={"priority": 0})
    gate = gate_of(rt)
    holder = ticket(rt)
    await gate.acquire(holder)
    order: list[str] = []

    async def wait(name: str, t: Ticket) -> None:
        await gate.acquire(t)
        order.append(name)
        gate.end_prefill(t)

    tasks = []
    for name, cls in (("batch-1", BATCH), ("chat-1", CHAT), ("batch-2", BATCH), ("chat-2", CHAT)):
        tasks.append(asyncio.ensure_future(wait(name, ticket(rt, cls))))
        await asyncio.sleep(0)
    gate.end_prefill(holder)
    await asyncio.wait_for(asyncio.gather(*tasks), 1)

    assert order == ["chat-1", "chat-2", "batch-1", "batch-2"]


async def test_a_short_prompt_passes_long_ones_blocked_by_the_long_limit() -> None:
    rt = make_runtime(admission={"max_prefilling": 3, "max_long_prefilling": 1})
    gate = gate_of(rt)
    await gate.acquire(ticket(rt, long=True))
    long_waiters = [await start(gate, ticket(rt, long=True)) for _ in range(3)]

    short = await asyncio.wait_for(gate.acquire(ticket(rt, long=False)), 1)

    assert short is not None
    assert not any(w.done() for w in long_waiters)
    assert totals(rt)[2:4] == (2, 1)
    for w in long_waiters:
        w.cancel()
    await asyncio.gather(*long_waiters, return_exceptions=True)
    assert totals(rt)[4] == 0


async def test_a_full_queue_refuses_at_once_with_retry_after() -> None:
    rt = make_runtime(chat={"max_in_flight": 1, "queue_limit": 1, "queue_timeout_s": 4})
    gate = gate_of(rt)
    await gate.acquire(ticket(rt))
    waiting = await start(gate, ticket(rt))

    with pytest.raises(Unavailable) as caught:
        await gate.acquire(ticket(rt))

    assert caught.value.code == "queue_full"
    assert (b"retry-after", b"4") in caught.value.headers()
    waiting.cancel()


async def test_no_queue_means_no_waiting() -> None:
    rt = make_runtime(chat={"max_in_flight": 1, "queue_limit": 0})
    gate = gate_of(rt)
    await gate.acquire(ticket(rt))

    with pytest.raises(Unavailable) as caught:
        await gate.acquire(ticket(rt))
    assert caught.value.code == "queue_full"


async def test_the_lane_deadline_ends_a_wait_with_503() -> None:
    rt = make_runtime(chat={"max_in_flight": 1, "queue_timeout_s": 0.05})
    gate = gate_of(rt)
    await gate.acquire(ticket(rt))
    loop = asyncio.get_running_loop()
    began = loop.time()

    with pytest.raises(Unavailable) as caught:
        await gate.acquire(ticket(rt))

    assert caught.value.code == "queue_timeout" and caught.value.status == 503
    assert caught.value.retry_after is not None and caught.value.retry_after >= 1
    assert loop.time() - began >= 0.04
    assert rt.lanes[CHAT].waiting == 0 and gate.waiting == 0


async def test_a_waiter_that_gives_up_leaves_no_trace() -> None:
    rt = make_runtime(chat={"max_in_flight": 1})
    gate = gate_of(rt)
    holder = ticket(rt)
    await gate.acquire(holder)
    quitter = ticket(rt)
    task = await start(gate, quitter)

    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gate.finish(holder)

    assert quitter.backend is None and not quitter.holds_lane
    assert totals(rt) == (0, 0, 0, 0, 0)


async def test_a_slot_granted_to_a_waiter_that_was_just_cancelled_is_given_back_by_finish() -> None:
    rt = make_runtime(chat={"max_in_flight": 1})
    gate = gate_of(rt)
    holder, late = ticket(rt), ticket(rt)
    await gate.acquire(holder)
    task = await start(gate, late)

    gate.finish(holder)  # hands the slot to `late` ...
    task.cancel()  # ... which is cancelled before it could run
    await asyncio.gather(task, return_exceptions=True)
    assert late.holds_lane  # the grant is on the ticket
    gate.finish(late)

    assert totals(rt) == (0, 0, 0, 0, 0)


async def test_long_prompts_are_refused_when_the_pool_admits_none() -> None:
    rt = make_runtime(admission={"max_prefilling": 2, "max_long_prefilling": 0})
    gate = gate_of(rt)

    with pytest.raises(Unavailable) as caught:
        await gate.acquire(ticket(rt, long=True))
    assert caught.value.code == "long_prompt_refused"
    # No wait helps: told not to retry, and no Retry-After.
    assert caught.value.headers() == [(b"x-should-retry", b"false")]
    assert await gate.acquire(ticket(rt, long=False)) is not None


async def test_no_routable_backend_is_503_without_waiting() -> None:
    rt = make_runtime(n_backends=2)
    for b in rt.pools["interactive"].backends:
        b.health = Health.DOWN

    with pytest.raises(Unavailable) as caught:
        await gate_of(rt).acquire(ticket(rt))
    assert caught.value.code == "no_healthy_backend"


async def test_a_retry_goes_to_a_backend_not_yet_tried() -> None:
    rt = make_runtime(n_backends=2)
    gate = gate_of(rt)
    t = ticket(rt)
    first = await gate.acquire(t)
    gate.retry_elsewhere(t)

    second = await gate.acquire(t)

    assert second is not first
    gate.retry_elsewhere(t)
    with pytest.raises(Unavailable):
        await gate.acquire(t)  # both tried
    gate.finish(t)
    assert totals(rt) == (0, 0, 0, 0, 0)


async def test_a_blind_hold_timer_is_cancelled_with_the_prefill() -> None:
    rt = make_runtime(admission={"max_prefilling": 1})
    gate = gate_of(rt)
    t = ticket(rt)
    await gate.acquire(t)
    fired: list[bool] = []
    t.timer = asyncio.get_running_loop().call_later(0.01, lambda: fired.append(True))

    gate.finish(t)
    await asyncio.sleep(0.03)

    assert not fired and t.timer is None


async def test_random_traffic_respects_every_limit_and_balances_to_zero() -> None:
    """Many requests of several lanes and lengths, arriving, prefilling, finishing and giving up
    in random order: no limit is ever exceeded and every counter returns to zero."""
    rt = make_runtime(
        n_backends=3,
        admission={"max_prefilling": 3, "max_long_prefilling": 1},
        chat={"max_in_flight": 5, "queue_timeout_s": 0.5},
        batch={"max_in_flight": 2, "priority": 9, "queue_timeout_s": 0.5},
        agent={"queue_timeout_s": 0.5},
    )
    gate = gate_of(rt)
    rng = random.Random(7)
    backends = rt.pools["interactive"].backends
    violations: list[str] = []

    def check() -> None:
        for b in backends:
            if b.prefilling > 3 or b.long_prefilling > 1:
                violations.append(f"{b.name}: {b.prefilling}/{b.long_prefilling}")
        for lane in rt.lanes.values():
            limit = lane.config.max_in_flight
            if limit is not None and lane.in_flight > limit:
                violations.append(f"{lane.name}: {lane.in_flight}")

    async def one(i: int) -> None:
        await asyncio.sleep(rng.random() * 0.05)
        t = ticket(rt, rng.choice([CHAT, BATCH, AGENT]), long=rng.random() < 0.4)
        try:
            await gate.acquire(t)
            check()
            await asyncio.sleep(rng.random() * 0.01)
            gate.end_prefill(t)
            await asyncio.sleep(rng.random() * 0.01)
        except Unavailable:
            pass
        finally:
            gate.finish(t)
            check()

    tasks = [asyncio.ensure_future(one(i)) for i in range(200)]
    await asyncio.sleep(0.03)
    for task in rng.sample(tasks, 20):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    assert violations == []
    assert totals(rt) == (0, 0, 0, 0, 0) and gate.waiting == 0


def test_lanes_of_one_pool_share_its_gate() -> None:
    rt = make_runtime()
    lanes: list[Lane] = list(rt.lanes.values())
    assert len({id(lane.pool.gate) for lane in lanes}) == 1
