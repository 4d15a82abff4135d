"""What a reload carries: pools, backends and lanes it keeps are the same objects, with their
counts, queues and connections, under new settings; what it drops drains and then closes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.errors import UpstreamConnectError
from router.fleet.backend import Backend, Health
from router.lanes.poolgate import Ticket
from router.observe.metrics import Metrics
from router.proxy.upstream import UpstreamPool
from router.state.runtime import Runtime, build_runtime
from tests.support.profiles import profile

A, B, C = (f"http://127.0.0.1:{port}" for port in (9201, 9202, 9203))


def shaped(backends: list[str], batch: list[str] | None = None, **changes: Any) -> Any:
    data = profile(backends, batch)
    pool = data["pools"]["interactive"]
    pool.update(changes.pop("pool", {}))
    for cls, extra in changes.pop("lanes", {}).items():
        data["lanes"][cls].update(extra)
    data.update(changes)
    return parse_profile(data)


async def _is_closed(upstream: UpstreamPool) -> bool:
    try:
        await upstream.request(b"GET", b"/", [], b"")
    except UpstreamConnectError as err:
        return "closed" in str(err)
    return False


def _backend(rt: Runtime, origin: str) -> Backend:
    pool = rt.pools["interactive"]
    return next(b for b in (*pool.members, *pool.draining) if b.name == origin)


async def test_a_reload_keeps_pools_backends_and_lanes_with_their_counts_under_new_settings() -> None:
    metrics = Metrics()
    old = build_runtime(shaped([A, B]), metrics)
    backend, lane = _backend(old, A), old.lanes[RequestClass.CHAT]
    backend.in_flight, backend.prefilling, backend.health, backend.drift = 3, 2, Health.UP, ("x",)
    lane.in_flight = 2
    upstream = backend.upstream

    new = build_runtime(
        shaped(
            [A, B],
            pool={"admission": {"max_prefilling": 1}},
            lanes={"chat": {"max_in_flight": 2, "priority": 5}},
        ),
        metrics,
        previous=old,
    )

    pool = new.pools["interactive"]
    assert pool is old.pools["interactive"] and new.lanes[RequestClass.CHAT] is lane
    assert _backend(new, A) is backend and backend.upstream is upstream
    assert (backend.in_flight, backend.prefilling, backend.health, backend.drift) == (3, 2, Health.UP, ("x",))
    assert pool.gate.limits.max_prefilling == 1 and lane.config.max_in_flight == 2 and lane.in_flight == 2
    # The limits apply at once to what is already counted: the lane is full, the backend too.
    assert pool.gate.try_take(Ticket(lane=lane, long=False, affinity=None)) is None
    await old.aclose()
    assert not await _is_closed(upstream)
    await new.aclose()
    assert await _is_closed(upstream)


async def test_changed_connection_settings_give_a_new_connection_pool_and_the_old_one_drains() -> None:
    metrics = Metrics()
    old = build_runtime(shaped([A]), metrics)
    backend = _backend(old, A)
    first = backend.upstream

    new = build_runtime(shaped([A], pool={"read_timeout_s": 9.0}), metrics, previous=old)

    assert _backend(new, A) is backend and backend.upstream is not first
    assert new.fleet.pending
    new.fleet.sweep()  # no request holds the old connection pool
    await asyncio.sleep(0)
    assert await _is_closed(first) and not await _is_closed(backend.upstream)
    for rt in (old, new):
        await rt.aclose()


async def test_a_backend_dropped_by_a_reload_drains_and_then_is_forgotten() -> None:
    metrics = Metrics()
    old = build_runtime(shaped([A, B]), metrics)
    b = _backend(old, B)
    b.in_flight = 1
    metrics.backend_up.labels("interactive", B).set(1)
    metrics.upstream_errors.labels("interactive", B, "upstream_closed").inc()

    new = build_runtime(shaped([A]), metrics, previous=old)
    pool = new.pools["interactive"]

    assert pool.draining == (b,) and b not in pool.routable()
    new.fleet.sweep()
    assert pool.draining == (b,)  # still busy
    b.in_flight = 0
    new.fleet.sweep()
    await asyncio.sleep(0)
    assert pool.draining == () and not new.fleet.pending
    assert await _is_closed(b.upstream)
    assert f'backend="{B}"' not in metrics.exposition().decode()
    for rt in (old, new):
        await rt.aclose()


async def test_a_backend_back_while_draining_keeps_its_counts_and_number_and_new_ones_count_on() -> None:
    metrics = Metrics()
    first = build_runtime(shaped([A, B]), metrics)
    assert [b.index for b in first.pools["interactive"].backends] == [0, 1]
    b = _backend(first, B)
    b.in_flight = 1
    second = build_runtime(shaped([A]), metrics, previous=first)
    third = build_runtime(shaped([C, B]), metrics, previous=second)

    pool = third.pools["interactive"]
    assert _backend(third, B) is b and b.in_flight == 1 and b in pool.backends
    assert [(x.name, x.index) for x in pool.backends] == [(B, 1), (C, 2)]
    assert _backend(third, C).label == "pool 'interactive' backend 2"
    assert [x.name for x in pool.draining] == [A]
    for rt in (first, second, third):
        await rt.aclose()


async def test_a_refused_build_changes_nothing_live() -> None:
    metrics = Metrics()
    old = build_runtime(shaped([A]), metrics)
    pool = old.pools["interactive"]

    with pytest.raises(ValueError):
        build_runtime(
            shaped([A, B], pool={"upstream_api_key": "ключ", "admission": {"max_prefilling": 1}}),
            metrics,
            previous=old,
        )

    assert [b.name for b in pool.members] == [A] and pool.gate.limits.max_prefilling is None
    assert pool.upstream_key is not None and pool.upstream_key.decode() == pool.config.upstream_api_key
    await old.aclose()


async def test_a_dropped_pool_closes_when_the_last_runtime_holding_it_lets_go() -> None:
    metrics = Metrics()
    old = build_runtime(shaped([A], batch=[B]), metrics)
    batch = old.pools["batch"]
    b = batch.backends[0]
    kept = {"long_context": {"pool": "interactive"}, "batch": {"pool": "interactive"}}
    new = build_runtime(shaped([A], lanes=kept), metrics, previous=old)
    assert "batch" not in new.pools and new.lanes[RequestClass.BATCH].pool is new.pools["interactive"]

    back = build_runtime(shaped([A], batch=[B]), metrics, previous=new)

    assert back.pools["batch"] is batch  # still held by `old`: taken back, not rebuilt
    await back.aclose()
    await new.aclose()
    assert not await _is_closed(b.upstream)
    await old.aclose()  # the last holder
    assert await _is_closed(b.upstream)


async def test_raised_limits_admit_queued_requests_at_once() -> None:
    metrics = Metrics()
    old = build_runtime(shaped([A], lanes={"chat": {"max_in_flight": 1}}), metrics)
    lane, gate = old.lanes[RequestClass.CHAT], old.pools["interactive"].gate
    held = Ticket(lane=lane, long=False, affinity=None)
    assert gate.try_take(held) is not None
    queued = Ticket(lane=lane, long=False, affinity=None)
    waiting = asyncio.ensure_future(gate.acquire(queued))
    async with asyncio.timeout(5):
        while lane.waiting == 0:
            await asyncio.sleep(0)

    new = build_runtime(shaped([A], lanes={"chat": {"max_in_flight": 2}}), metrics, previous=old)

    async with asyncio.timeout(5):
        assert (await waiting).name == A  # no release happened in between
    assert lane.in_flight == 2
    for t in (held, queued):
        gate.finish(t)
    for rt in (old, new):
        await rt.aclose()


async def test_closing_while_an_error_is_being_handled_raises_nothing() -> None:
    # Closing awaits on every way out. Compiled (docs/compiled.md), an await in a `finally` would
    # raise, once the block ends, the exception the caller is handling: the runtime's pools and
    # the fleet's closing both wait on their way out.
    metrics = Metrics()
    old = build_runtime(shaped([A]), metrics)
    new = build_runtime(shaped([B]), metrics, previous=old)  # A drains, held by no request
    upstream = _backend(old, A).upstream
    try:
        raise LookupError("handled by the caller")
    except LookupError:
        await old.aclose()
        await new.aclose()
    assert await _is_closed(upstream)
