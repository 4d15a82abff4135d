"""Admission of a request naming a LoRA adapter: only backends that hold it take it (or, with a
path to load it from, any while none does), placed by the adapter's name whatever the lane's
strategy; a waiting adapter request does not hold up the others behind it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.balance.adapter_placement import ADAPTER_MIN_BOUND
from router.config.load import parse_profile
from router.config.models import RequestClass
from router.errors import Unavailable
from router.fleet.adapters import AdapterNeed
from router.fleet.backend import Backend, Health
from router.lanes.poolgate import PoolGate, Ticket
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from tests.support.profiles import profile

CHAT = RequestClass.CHAT


def make_runtime(n_backends: int, admission: dict[str, Any] | None = None, **pool: Any) -> Runtime:
    data = profile([f"http://127.0.0.1:{9100 + i}" for i in range(n_backends)])
    data["pools"]["interactive"]["admission"] = admission or {}
    data["pools"]["interactive"].update(pool)
    return build_runtime(parse_profile(data), Metrics())


def backends(rt: Runtime) -> tuple[Backend, ...]:
    return rt.pools["interactive"].backends


def serve(backend: Backend, *adapters: str) -> None:
    """What the backend's /v1/models listed (the health checker's finding)."""
    backend.served = frozenset({"fake-model", *adapters})
    backend.adapters = tuple((a, "fake-model") for a in adapters)


def adapter_ticket(rt: Runtime, name: str, path: str | None = None) -> Ticket:
    t = Ticket(lane=rt.lanes[CHAT], long=False, affinity=None)
    t.for_adapter(AdapterNeed(name, path, lenient=False))
    return t


def gate_of(rt: Runtime) -> PoolGate:
    return rt.pools["interactive"].gate


async def test_only_holders_take_an_adapters_requests() -> None:
    rt = make_runtime(4)
    b = backends(rt)
    serve(b[0])
    serve(b[1], "sql")
    serve(b[2], "sql", "chat-lora")
    serve(b[3], "chat-lora")
    gate = gate_of(rt)
    went = set()
    for _ in range(20):
        t = adapter_ticket(rt, "sql")
        went.add(await gate.acquire(t))  # held: every pick sees the load the others left
    assert went <= {b[1], b[2]} and went == {b[1], b[2]}  # spilled to the second holder, no further


async def test_an_adapter_keeps_to_one_holder_while_its_load_allows() -> None:
    rt = make_runtime(3)
    for backend in backends(rt):
        serve(backend, "sql")
    gate = gate_of(rt)
    first = None
    for _ in range(10):
        t = adapter_ticket(rt, "sql")
        chosen = await gate.acquire(t)
        first = first or chosen
        assert chosen is first
        gate.finish(t)  # one at a time: never past the bound


async def test_an_adapter_nobody_holds_is_refused_by_the_gate_and_one_with_a_path_may_go_anywhere() -> None:
    rt = make_runtime(2)
    for backend in backends(rt):
        serve(backend)
    gate = gate_of(rt)
    with pytest.raises(Unavailable) as refused:
        await gate.acquire(adapter_ticket(rt, "sql"))
    assert refused.value.code == "adapter_unavailable"
    loadable = adapter_ticket(rt, "sql", path="/srv/lora/sql")
    assert await gate.acquire(loadable) in backends(rt)


async def test_a_down_holder_leaves_its_adapter_unavailable_not_sent_elsewhere() -> None:
    rt = make_runtime(2)
    b = backends(rt)
    serve(b[0], "sql")
    serve(b[1])
    b[0].health = Health.DOWN
    with pytest.raises(Unavailable) as refused:
        await gate_of(rt).acquire(adapter_ticket(rt, "sql"))
    assert refused.value.code == "adapter_unavailable" and b[1].in_flight == 0


async def test_a_waiting_adapter_request_does_not_hold_up_other_requests() -> None:
    rt = make_runtime(2, admission={"max_prefilling": 1, "max_long_prefilling": 0})
    b = backends(rt)
    serve(b[0], "sql")
    serve(b[1])
    gate = gate_of(rt)
    holding = adapter_ticket(rt, "sql")
    assert await gate.acquire(holding) is b[0]
    waiting = adapter_ticket(rt, "sql")
    queued = asyncio.ensure_future(gate.acquire(waiting))
    await asyncio.sleep(0)  # let it reach the queue
    assert gate.waiting == 1
    other = Ticket(lane=rt.lanes[CHAT], long=False, affinity=None)
    async with asyncio.timeout(5):
        assert await gate.acquire(other) is b[1]
    gate.finish(holding)
    async with asyncio.timeout(5):
        assert await queued is b[0]


async def test_an_adapter_to_load_spills_into_one_more_backend_only_when_its_holders_are_past_the_bound() -> (
    None
):
    rt = make_runtime(3)
    b = backends(rt)
    serve(b[0], "sql")
    serve(b[1])
    serve(b[2])
    gate = gate_of(rt)
    went = []
    for _ in range(ADAPTER_MIN_BOUND):
        went.append(await gate.acquire(adapter_ticket(rt, "sql", path="/srv/lora/sql")))
    assert went == [b[0]] * ADAPTER_MIN_BOUND
    # Past the bound, but a load of it is under way somewhere: wait for that one, start none.
    b[0].loading = frozenset({"sql"})
    held = adapter_ticket(rt, "sql", path="/srv/lora/sql")
    assert gate.try_take(held) is b[0]
    gate.finish(held)
    b[0].loading = frozenset()
    spilled = await gate.acquire(adapter_ticket(rt, "sql", path="/srv/lora/sql"))
    assert spilled in (b[1], b[2])
    # Without a path, the same load stays on the one holder.
    assert await gate.acquire(adapter_ticket(rt, "sql")) is b[0]
