"""The upstream client's bounds on a hostile backend: response head size and field count, the time
to the first byte, to the end of the head and between body reads, and no replay of a request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from router.config.load import ConfigError, parse_profile
from router.errors import UpstreamClosed, UpstreamProtocolError, UpstreamTimeout
from router.observe.metrics import Metrics
from router.proxy.limits import ResponseLimits
from router.proxy.upstream import UpstreamPool
from router.proxy.upstream_connection import UpstreamConnection
from router.state.runtime import build_runtime
from tests.proxy.rawserver import (
    Handler,
    RawServer,
    ServeFn,
    dribble,
    echo_target,
    get,
    ok,
    stream_head_field,
    wait_until,
)
from tests.support.profiles import profile

LIMIT = 64 * 1024
ONE_READ = 256 * 1024  # the most either event loop hands over per read


class _Counted(asyncio.Protocol):
    """Stands between the event loop and an upstream connection, counting the bytes the loop hands
    it: what the router read. (A subclass would not do: the connection may be compiled.)"""

    def __init__(self, conn: UpstreamConnection, reads: list[int]) -> None:
        self._conn, self._reads = conn, reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._conn.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._reads.append(len(data))
        self._conn.data_received(data)

    def eof_received(self) -> bool | None:
        return self._conn.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn.connection_lost(exc)

    def pause_writing(self) -> None:
        self._conn.pause_writing()

    def resume_writing(self) -> None:
        self._conn.resume_writing()


@pytest.fixture
async def counted_reads(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[int]]:
    reads: list[int] = []
    loop = asyncio.get_running_loop()
    connect = loop.create_connection

    async def counting(factory: Callable[[], UpstreamConnection], *args: Any, **kwargs: Any) -> Any:
        return await connect(lambda: _Counted(factory(), reads), *args, **kwargs)

    monkeypatch.setattr(loop, "create_connection", counting)
    yield reads
    assert reads, "no read was counted: the counting no longer sees the connection"


def _replying(*parts: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(b"".join(parts))
        await server.wait_eof(reader)

    return handler


async def test_a_huge_head_field_is_cut_after_the_limit_plus_one_read(
    serve: ServeFn, counted_reads: list[int]
) -> None:
    written: list[int] = []

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        written.append(await stream_head_field(writer, 128 * 1024 * 1024))

    server = await serve(flood)
    async with UpstreamPool(server.origin, label="pool 'p' backend 0") as pool:
        with pytest.raises(UpstreamProtocolError, match=f"response head larger than {LIMIT} bytes"):
            await pool.request(b"POST", b"/", [], b"{}")
        assert pool.stats().open == 0
    await wait_until(lambda: bool(written), "the backend to see the connection go")
    assert sum(counted_reads) <= LIMIT + ONE_READ
    assert written[0] < 128 * 1024 * 1024


async def _flood(writer: asyncio.StreamWriter, head: bytes, size: int) -> int:
    """Write `head`, then `size` bytes of "a" in 64 KiB writes that wait for the peer; return what
    was written when the peer went away (or all of it)."""
    writer.write(head)
    written = 0
    try:
        while written < size:
            writer.write(b"a" * 65536)
            await writer.drain()
            written += 65536
    except ConnectionError:
        pass
    return written


@pytest.mark.parametrize(
    "prefix",
    [b"5\r\nhello\r\n0\r\nX-Trailer: ", b"5;ext="],
    ids=["trailer", "chunk-extension"],
)
async def test_huge_chunk_framing_is_cut_like_a_head(
    serve: ServeFn, counted_reads: list[int], prefix: bytes
) -> None:
    """After the head, bytes that carry no body (a trailer field, a chunk extension) are bounded
    too: the parser would keep a trailer field whole until it ends."""
    written: list[int] = []
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        written.append(await _flood(writer, head + prefix, 128 * 1024 * 1024))

    server = await serve(flood)
    async with UpstreamPool(server.origin, label="pool 'p' backend 0") as pool:
        response = await pool.request(b"POST", b"/", [], b"{}")
        with pytest.raises(UpstreamProtocolError, match="chunk framing or trailers"):
            async for _ in response:
                pass
        await response.aclose()
    await wait_until(lambda: bool(written), "the backend to see the connection go")
    assert sum(counted_reads) <= 2 * LIMIT + ONE_READ
    assert written[0] < 128 * 1024 * 1024


@pytest.mark.parametrize(("fields", "fails"), [(100, False), (101, True), (10_000, True)])
async def test_header_fields_are_counted(serve: ServeFn, fields: int, fails: bool) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(fields - 1))
    server = await serve(_replying(head, b"Content-Length: 2\r\n\r\nok"))
    async with UpstreamPool(server.origin) as pool:
        if fails:
            with pytest.raises(UpstreamProtocolError, match="more than 100 response header fields"):
                await pool.request(b"GET", b"/", [], b"")
        else:
            assert await get(pool) == (200, b"ok")


async def test_a_head_just_under_the_limit_with_its_body_in_the_same_write(serve: ServeFn) -> None:
    body = b"b" * (3 * LIMIT)
    start = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Pad: " % len(body)
    head = start + b"p" * (LIMIT - len(start) - 4) + b"\r\n\r\n"
    assert len(head) == LIMIT
    server = await serve(_replying(head, body))
    async with UpstreamPool(server.origin) as pool:
        assert await get(pool) == (200, body)


async def test_a_dribbled_head_is_cut_at_the_head_read_timeout(serve: ServeFn) -> None:
    async def slowly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        # Each byte well within the body's idle timeout; the head as a whole is not.
        await dribble(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        server.eofs += writer.transport.is_closing()

    server = await serve(slowly)
    async with UpstreamPool(server.origin, head_read_timeout=0.4, read_timeout=5) as pool:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UpstreamTimeout, match="head incomplete"):
            await pool.request(b"GET", b"/", [], b"")
        # uvloop's timers count whole milliseconds: one may fire a hair before 0.4 s by loop.time().
        assert 0.4 - 0.002 <= loop.time() - started < 1.5
    await wait_until(lambda: server.eofs == 1, "the backend to see the connection closed")


async def test_a_slow_whole_answer_waits_beyond_the_read_timeout(serve: ServeFn) -> None:
    answered = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        await asyncio.sleep(0.5)  # generating: silent for five read timeouts
        writer.write(ok(b"done"))
        answered.set()
        await server.wait_eof(reader)

    server = await serve(slow)
    async with UpstreamPool(server.origin, head_timeout=10, read_timeout=0.1) as pool:
        assert await get(pool) == (200, b"done")
    assert answered.is_set()


async def test_a_shorter_head_timeout_applies_on_a_reused_connection(serve: ServeFn) -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(ok(b"first"))
        await server.next_request(reader)
        await server.wait_eof(reader)

    server = await serve(once)
    # The first exchange leaves the timer set for a body deadline far beyond the head timeout.
    async with UpstreamPool(server.origin, head_timeout=0.2, read_timeout=30) as pool:
        assert await get(pool) == (200, b"first")
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UpstreamTimeout, match="no response within"):
            await pool.request(b"POST", b"/", [], b"{}")
        assert loop.time() - started < 1.5
    assert server.connections == 1


@pytest.mark.parametrize("then", ["silence", "close"])
async def test_a_head_without_its_body_fails_before_the_body_begins(serve: ServeFn, then: str) -> None:
    async def bare(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n")
        if then == "silence":
            await server.wait_eof(reader)

    server = await serve(bare)
    async with UpstreamPool(server.origin, read_timeout=0.2) as pool:
        response = await pool.request(b"POST", b"/", [], b"{}")
        assert response.status == 200
        expected = UpstreamTimeout if then == "silence" else UpstreamClosed
        with pytest.raises(expected):
            await response.wait_body()
        assert pool.stats().open == 0


async def test_an_expired_idle_connection_is_closed_by_the_client(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin, idle_expiry=0.3) as pool:
        loop = asyncio.get_running_loop()
        await get(pool)
        parked = loop.time()
        await wait_until(lambda: server.eofs == 1, "the backend to see the idle connection closed")
        assert 0.3 - 0.01 <= loop.time() - parked < 0.3 + 0.5


def test_pool_timeouts_are_validated_and_reach_each_backends_upstream_pool() -> None:
    data = profile(["http://127.0.0.1:9401", "http://127.0.0.1:9402"])
    pool = data["pools"]["interactive"]
    pool.update(response_head_timeout_s=30, head_read_timeout_s=2, read_timeout_s=7, upstream_keepalive_s=3)
    runtime = build_runtime(parse_profile(data), Metrics())
    backends = runtime.pools["interactive"].backends
    assert [b.label for b in backends] == ["pool 'interactive' backend 0", "pool 'interactive' backend 1"]
    upstream = backends[1].upstream
    assert upstream._limits == ResponseLimits(head_timeout=30, head_read_timeout=2, read_timeout=7)
    assert (upstream._idle_expiry, upstream._label) == (3, backends[1].label)
    for field in ("response_head_timeout_s", "head_read_timeout_s", "upstream_keepalive_s"):
        with pytest.raises(ConfigError, match=field):
            parse_profile({**data, "pools": {"interactive": {**pool, field: 0}}})
