"""Slow-client pieces: the lag rule, the bounded memory, and the bounded stream buffers."""

from __future__ import annotations

import asyncio

from router.config.models import SlowClientConfig
from router.lanes.slowclient import BufferBudget, SlowClients, StreamBuffer, client_identity
from router.state.runtime import LagPolicy


def test_lag_is_undelivered_bytes_above_the_threshold() -> None:
    policy = LagPolicy.from_config(SlowClientConfig(lag_bytes=64 * 1024))

    assert not policy.lagging(64 * 1024)
    assert policy.lagging(64 * 1024 + 1)


def test_slow_clients_are_remembered_for_their_ttl() -> None:
    memory = SlowClients(ttl_s=10, max_entries=100)
    memory.mark("a", now=0.0)

    assert memory.is_slow("a", 9.9)
    assert not memory.is_slow("a", 10.1)
    assert len(memory) == 0  # expired entries go when looked at
    assert not memory.is_slow("never", 0.0)


def test_marking_again_extends_the_memory() -> None:
    memory = SlowClients(ttl_s=10, max_entries=100)
    memory.mark("a", 0.0)
    memory.mark("a", 8.0)

    assert memory.is_slow("a", 15.0)


def test_slow_client_memory_is_bounded_oldest_first() -> None:
    memory = SlowClients(ttl_s=100, max_entries=16)
    for i in range(40):
        memory.mark(f"c{i}", float(i))

    assert len(memory) == 16
    assert not memory.is_slow("c0", 40.0)
    assert memory.is_slow("c39", 40.0)


def test_identity_prefers_the_client_id_and_is_scoped_to_the_key() -> None:
    by_id = client_identity("web", b"device-7", "10.0.0.1")

    assert by_id == client_identity("web", b"device-7", "10.0.0.2")
    assert by_id != client_identity("other-key", b"device-7", "10.0.0.1")
    assert client_identity("web", None, "10.0.0.1") != client_identity("web", None, "10.0.0.2")
    assert client_identity("web", None, "10.0.0.1") != by_id


async def test_buffer_passes_every_byte_in_order() -> None:
    budget = BufferBudget(1 << 20)
    buf = StreamBuffer(budget, cap=1 << 20)
    sent = [bytes([i]) * (i + 1) for i in range(50)]

    async def produce() -> None:
        for chunk in sent:
            await buf.put(chunk)
        buf.end()

    received = bytearray()

    async def consume() -> None:
        while (data := await buf.get()) is not None:
            received.extend(data)

    await asyncio.gather(produce(), consume())

    assert bytes(received) == b"".join(sent)
    assert budget.used == 0 and buf.error is None


async def test_a_full_buffer_makes_the_producer_wait_not_drop() -> None:
    budget = BufferBudget(1 << 20)
    buf = StreamBuffer(budget, cap=100)
    await buf.put(b"x" * 60)
    await buf.put(b"y" * 60)  # above the cap now: the next put waits

    blocked = asyncio.ensure_future(buf.put(b"z" * 10))
    await asyncio.sleep(0.01)
    assert not blocked.done() and buf.size == 120

    assert await buf.get() == b"x" * 60 + b"y" * 60
    await asyncio.wait_for(blocked, 1)
    assert await buf.get() == b"z" * 10


async def test_the_global_budget_holds_back_every_stream() -> None:
    budget = BufferBudget(cap=100)
    a, b = StreamBuffer(budget, cap=1000), StreamBuffer(budget, cap=1000)
    await a.put(b"a" * 80)
    await b.put(b"b" * 30)  # an empty buffer always takes one chunk
    assert budget.used == 110

    blocked = asyncio.ensure_future(b.put(b"b" * 5))
    await asyncio.sleep(0.01)
    assert not blocked.done()

    await a.get()
    await asyncio.wait_for(blocked, 1)
    assert budget.used == 35


async def test_budget_reports_its_level() -> None:
    levels: list[int] = []
    budget = BufferBudget(cap=1000, on_change=levels.append)
    buf = StreamBuffer(budget, cap=1000)
    await buf.put(b"12345")
    await buf.get()

    assert levels == [5, 0]


async def test_release_returns_unsent_bytes_to_the_budget() -> None:
    budget = BufferBudget(cap=1000)
    buf = StreamBuffer(budget, cap=1000)
    await buf.put(b"abc")
    buf.release()

    assert budget.used == 0 and buf.size == 0


async def test_an_error_ends_the_stream_after_the_bytes_before_it() -> None:
    buf = StreamBuffer(BufferBudget(1000), cap=1000)
    await buf.put(b"partial")
    buf.end(RuntimeError("backend died"))

    assert await buf.get() == b"partial"
    assert await buf.get() is None
    assert isinstance(buf.error, RuntimeError)
