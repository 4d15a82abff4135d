"""The upstream HTTP/1.1 client against real loopback servers (plain asyncio servers, and uvicorn
where the backend's view of a disconnect matters)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from router.errors import (
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from router.proxy.http1 import body_is_delimited, build_head, head_with_fields, parse_origin
from router.proxy.limits import ResponseLimits
from router.proxy.upstream import PoolStats, UpstreamPool
from router.proxy.upstream_connection import HIGH_WATER, UpstreamConnection
from tests.proxy.rawserver import (
    CHUNKED_HEAD,
    LAST_CHUNK,
    RawServer,
    ServeFn,
    chunk,
    closed_port,
    echo_target,
    get,
    ok,
    wait_until,
)

# -- request serialization ---------------------------------------------------------------------


async def test_request_is_sent_as_given_plus_host_and_length(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(
            b"POST", b"/v1/x?y=1", [(b"X-Trace", b"a b"), (b"accept", b"*/*")], b"abc"
        )
        assert await response.read() == b"you asked for /v1/x?y=1"
        await get(pool, b"/plain")
    host = f"127.0.0.1:{server.port}".encode()
    assert server.requests[0].raw == (
        b"POST /v1/x?y=1 HTTP/1.1\r\nX-Trace: a b\r\naccept: */*\r\nHost: "
        + host
        + b"\r\nContent-Length: 3\r\n\r\nabc"
    )
    # A bodiless GET carries no Content-Length.
    assert server.requests[1].raw == b"GET /plain HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"


def test_build_head_keeps_caller_host_and_length() -> None:
    head = build_head(b"POST", b"/", [(b"host", b"h"), (b"content-length", b"2")], 2, b"x:1")
    assert head == b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\n"


@pytest.mark.parametrize(
    ("target", "headers", "length"),
    [
        (b"/", [(b"x", b"a\r\nevil: 1")], 0),
        (b"/", [(b"x", b"a\nb")], 0),
        (b"/", [(b"x\r", b"a")], 0),
        (b"/", [(b"x", b"a\rb")], 0),
        (b"/", [(b"x", b"\n\r")], 0),
        (b"/ HTTP/1.0\r\n", [], 0),
        (b"/a b", [], 0),
        (b"/", [(b"Content-Length", b"5")], 3),
        (b"/", [(b"content-length", b"-3")], 3),
        (b"/", [(b"Transfer-Encoding", b"chunked")], 3),
    ],
)
def test_build_head_rejects_framing_changes(
    target: bytes, headers: list[tuple[bytes, bytes]], length: int
) -> None:
    with pytest.raises(ValueError):
        build_head(b"POST", target, headers, length, b"h")


@pytest.mark.parametrize(
    ("method", "target", "headers", "length"),
    [
        (b"POST", b"/v1/chat/completions", [(b"content-type", b"application/json"), (b"accept", b"*/*")], 12),
        (b"POST", b"/", [], 0),
        (b"GET", b"/v1/responses/r?stream=true", [(b"x-request-id", b"k:1"), (b"traceparent", b"00-a")], 0),
        (b"POST", b"/", [(b"x", b"a\r\nevil: 1")], 3),
        (b"POST", b"/", [(b"x", b"a\nb")], 3),
        (b"POST", b"/a b", [], 3),
        (b"GET", b"/ HTTP/1.0\r\n", [], 0),
    ],
)
def test_head_with_fields_is_build_head(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], length: int
) -> None:
    """Header lines written by the caller give the same head, refused for the same reasons."""
    fields = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    try:
        expected = build_head(method, target, headers, length, b"h:1")
    except ValueError:
        with pytest.raises(ValueError):
            head_with_fields(method, target, fields, len(headers), length, b"h:1")
        return
    assert head_with_fields(method, target, fields, len(headers), length, b"h:1") == expected


def test_parse_origin() -> None:
    assert parse_origin("http://10.0.0.1:8101").host_header == b"10.0.0.1:8101"
    assert parse_origin("http://backend/").port == 80
    assert parse_origin("http://backend").host_header == b"backend"
    v6 = parse_origin("http://[::1]:9000")
    assert (v6.host, v6.port, v6.host_header) == ("::1", 9000, b"[::1]:9000")
    secure = parse_origin("https://vllm.internal")
    assert (secure.tls, secure.port, secure.host_header, str(secure)) == (
        True,
        443,
        b"vllm.internal",
        "https://vllm.internal",
    )
    assert parse_origin("https://10.0.0.1:8443").host_header == b"10.0.0.1:8443"
    for bad in ("ftp://x", "x:1", "http://x:1/v1", "http://u:p@x:1", "https://x:1/v1"):
        with pytest.raises(ValueError):
            UpstreamPool(bad)


# -- response framing --------------------------------------------------------------------------


async def test_content_length_response(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello")
        await writer.drain()
        writer.write(b" world")
        await server.wait_eof(reader)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        assert response.status == 201
        assert response.headers == [(b"Content-Type", b"text/plain"), (b"Content-Length", b"11")]
        assert await response.read() == b"hello world"
        await response.aclose()
        assert pool.stats().idle == 1


async def test_take_ready_gives_what_arrived_and_at_end_whether_it_was_all(serve: ServeFn) -> None:
    rest = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello")
        await writer.drain()
        await rest.wait()
        writer.write(b" world")
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nwhole")
        await server.wait_eof(reader)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        await response.wait_body()
        assert (response.take_ready(), response.at_end) == (b"hello", False)
        assert response.take_ready() is None
        rest.set()
        assert [part async for part in response] == [b" world"]
        whole = await pool.request(b"GET", b"/", [], b"")
        await whole.wait_body()
        assert (whole.take_ready(), whole.at_end) == (b"whole", True)
        await whole.aclose()
        assert pool.stats().idle == 1


async def test_chunked_response_with_trailers(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n") + b"a;ext=1\r\n0123456789\r\n")
        await writer.drain()
        writer.write(chunk(b"x" * 70000) + b"0\r\nX-Trailer: t\r\n\r\n")
        await server.wait_eof(reader)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        assert await response.read() == b"data: 1\n\n0123456789" + b"x" * 70000
        assert response.headers == [(b"Transfer-Encoding", b"chunked")]
        await response.aclose()
        assert pool.stats().idle == 1


async def test_read_until_close_body_is_not_reused(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil")
        await writer.drain()
        writer.write(b" close")

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        assert await get(pool) == (200, b"until close")
        assert await get(pool) == (200, b"until close")
        assert pool.stats().open == 0
    assert server.connections == 2


@pytest.mark.parametrize(
    ("method", "reply"),
    [
        (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"),
        (b"GET", b"HTTP/1.1 204 No Content\r\n\r\n"),
        (b"GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\n\r\n"),
        (b"GET", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
    ],
)
async def test_bodiless_responses_keep_the_connection(serve: ServeFn, method: bytes, reply: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(reply)
        await echo_target(reader, writer, server)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(method, b"/", [], b"")
        assert response.status == int(reply.rsplit(b"HTTP/1.1 ", 1)[1][:3])
        assert await response.read() == b""
        await response.aclose()
        assert await get(pool, b"/next") == (200, b"you asked for /next")
    assert server.connections == 1


async def test_connection_close_response_is_not_reused(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(ok(b"bye", b"Connection: close\r\n"))
        await server.wait_eof(reader)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        assert await get(pool) == (200, b"bye")
        assert pool.stats().open == 0
        await wait_until(lambda: server.eofs == 1, "the server to see the connection closed")


async def test_bytes_after_the_response_spoil_the_connection(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(ok(b"one") + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
        await server.wait_eof(reader)
        while (request := await server.next_request(reader)) is not None:
            writer.write(ok(request.target))

    async def fresh(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        if server.connections == 1:
            await handler(reader, writer, server)
        else:
            await echo_target(reader, writer, server)

    server = await serve(fresh)
    async with UpstreamPool(server.origin) as pool:
        assert await get(pool) == (200, b"one")
        assert await get(pool, b"/two") == (200, b"you asked for /two")
    assert server.connections == 2


async def test_malformed_status_line_is_a_protocol_error(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 2x0 OK\r\n\r\n")
        await server.wait_eof(reader)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        with pytest.raises(UpstreamProtocolError):
            await pool.request(b"GET", b"/", [], b"")
        assert pool.stats().open == 0
        await wait_until(lambda: server.eofs == 1, "the server to see the connection closed")


async def test_malformed_chunk_mid_body_is_a_protocol_error(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"fine"))
        await writer.drain()
        writer.write(b"zz\r\nbroken\r\n")
        await server.wait_eof(reader)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        assert await anext(response) == b"fine"
        with pytest.raises(UpstreamProtocolError):
            await anext(response)
        assert pool.stats().open == 0


# -- keep-alive --------------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin) as pool:
        for i in range(5):
            assert await get(pool, b"/%d" % i) == (200, b"you asked for /%d" % i)
        assert pool.stats().open == 1
    assert server.connections == 1
    assert len(server.requests) == 5


async def test_server_closing_an_idle_connection_is_noticed(serve: ServeFn) -> None:
    async def one_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        request = await server.next_request(reader)
        assert request is not None
        writer.write(ok(request.target))  # keep-alive response, then close anyway

    server = await serve(one_per_connection)
    async with UpstreamPool(server.origin) as pool:
        assert await get(pool, b"/a") == (200, b"/a")
        await wait_until(lambda: pool.stats().open == 0, "the pool to drop the closed connection")
        assert await get(pool, b"/b") == (200, b"/b")
    assert server.connections == 2


async def test_reused_connection_dying_after_the_request_is_not_retried(serve: ServeFn) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(ok(b"first"))
        await server.next_request(reader)  # then close without answering

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        assert await get(pool) == (200, b"first")
        with pytest.raises(UpstreamClosed, match="before responding"):
            await pool.request(b"POST", b"/again", [], b"{}")
        assert pool.stats().open == 0
    assert server.connections == 1
    assert [r.target for r in server.requests] == [b"/", b"/again"]


@pytest.mark.parametrize("reset", [False, True])
async def test_fresh_connection_dying_after_the_request_is_closed(serve: ServeFn, reset: bool) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        if reset:
            writer.transport.abort()  # RST instead of FIN

    server = await serve(hang_up)
    async with UpstreamPool(server.origin) as pool:
        with pytest.raises(UpstreamClosed, match="before responding") as caught:
            await pool.request(b"POST", b"/", [], b"{}")
        assert not caught.value.retryable
        assert pool.stats().open == 0
    assert server.connections == 1
    assert len(server.requests) == 1


async def test_closing_before_the_headers_end_is_upstream_closed(serve: ServeFn) -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")

    server = await serve(half)
    async with UpstreamPool(server.origin) as pool:
        with pytest.raises(UpstreamClosed):
            await pool.request(b"GET", b"/", [], b"")


async def test_idle_connections_expire(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin, idle_expiry=0.2) as pool:
        await get(pool)
        assert pool.stats().idle == 1
        await wait_until(lambda: pool.stats().open == 0, "the idle connection to expire")
        await wait_until(lambda: server.eofs == 1, "the server to see the expired connection close")
        assert await get(pool, b"/b") == (200, b"you asked for /b")
    assert server.connections == 2


async def test_max_idle_bounds_parked_connections(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin, max_idle=2) as pool:
        responses = [await pool.request(b"GET", b"/", [], b"") for _ in range(4)]
        assert pool.stats().in_use == 4
        for response in responses:
            await response.read()
            await response.aclose()
        assert (pool.stats().idle, pool.stats().in_use) == (2, 0)


# -- connecting --------------------------------------------------------------------------------


async def test_connection_refused() -> None:
    port = closed_port()
    async with UpstreamPool(f"http://127.0.0.1:{port}", label="pool 'p' backend 3") as pool:
        with pytest.raises(UpstreamConnectError, match="cannot connect: connection refused") as caught:
            await pool.request(b"GET", b"/", [], b"")
        assert pool.stats().connecting == 0
    # The message may reach a client: it names the backend by its label, never by its address.
    assert caught.value.message.startswith("pool 'p' backend 3: ")
    assert "127.0.0.1" not in caught.value.message and str(port) not in caught.value.message


@contextlib.contextmanager
def full_backlog() -> Iterator[int]:
    """A listener whose accept queue is full, so further SYNs are dropped and connect() hangs."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(listener.getsockname())
            fillers.append(filler)
        yield listener.getsockname()[1]
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_connect_timeout() -> None:
    with full_backlog() as port:
        async with UpstreamPool(f"http://127.0.0.1:{port}", connect_timeout=0.2) as pool:
            with pytest.raises(UpstreamConnectError, match="timed out"):
                await pool.request(b"GET", b"/", [], b"")
            assert pool.stats().connecting == 0


class _SocketOnlyTransport(asyncio.Transport):
    """Just enough transport to hand a real socket to `connection_made`."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock if name == "socket" else default


async def test_tcp_nodelay_is_set_on_upstream_sockets() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as sock,
    ):
        # Event loops happen to enable it on their own today; start from off to see ours.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        conn = UpstreamConnection(asyncio.get_running_loop(), ResponseLimits(), "b", lambda c: None)
        conn.connection_made(_SocketOnlyTransport(sock))
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


async def test_pool_exhausted_and_waiting_for_a_slot(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin, max_connections=1, connect_timeout=0.2) as pool:
        held = await pool.request(b"GET", b"/held", [], b"")
        with pytest.raises(UpstreamConnectError, match="pool exhausted"):
            await pool.request(b"GET", b"/", [], b"")
        waiting = asyncio.create_task(get(pool, b"/waited"))
        await wait_until(lambda: pool.stats().waiting == 1, "the second request to wait")
        assert await held.read() == b"you asked for /held"  # reading to the end releases the slot
        assert await waiting == (200, b"you asked for /waited")
        assert pool.stats() == PoolStats(open=1, idle=1, in_use=0, connecting=0, waiting=0)
    assert server.connections == 1


async def test_a_woken_waiter_that_is_cancelled_passes_the_slot_on(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin, max_connections=1) as pool:
        held = await pool.request(b"GET", b"/held", [], b"")
        first = asyncio.create_task(get(pool, b"/first"))
        second = asyncio.create_task(get(pool, b"/second"))
        await wait_until(lambda: pool.stats().waiting == 2, "both requests to wait")
        await held.aclose()  # wakes `first`...
        first.cancel()  # ...which is cancelled before it can take the slot
        assert await second == (200, b"you asked for /second")
        with pytest.raises(asyncio.CancelledError):
            await first
        assert pool.stats().waiting == 0


async def test_many_concurrent_requests_share_a_bounded_pool(serve: ServeFn) -> None:
    server = await serve(echo_target)
    async with UpstreamPool(server.origin, max_connections=4) as pool:
        results = await asyncio.gather(*(get(pool, b"/%d" % i) for i in range(64)))
        assert results == [(200, b"you asked for /%d" % i) for i in range(64)]
        assert pool.stats().in_use == 0
        assert pool.stats().open <= 4
    assert server.connections <= 4


@pytest.mark.parametrize(
    ("headers", "delimited"),
    [
        ([(b"Content-Length", b"3")], True),
        ([(b"transfer-encoding", b"gzip, chunked")], True),
        ([(b"Transfer-Encoding", b"chunked, gzip")], False),
        ([(b"content-type", b"text/plain")], False),
    ],
)
def test_body_is_delimited(headers: list[tuple[bytes, bytes]], delimited: bool) -> None:
    assert body_is_delimited(headers) is delimited


async def test_pool_aclose_fails_waiters_and_leased_responses(serve: ServeFn) -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"part"))
        await server.wait_eof(reader)

    server = await serve(stall)
    pool = UpstreamPool(server.origin, max_connections=1)
    response = await pool.request(b"GET", b"/", [], b"")
    waiting = asyncio.create_task(pool.request(b"GET", b"/", [], b""))
    await wait_until(lambda: pool.stats().waiting == 1, "the second request to wait")
    await pool.aclose()
    with pytest.raises(UpstreamConnectError, match="closed"):
        await waiting
    assert await anext(response) == b"part"
    with pytest.raises(UpstreamClosed):
        await anext(response)
    with pytest.raises(UpstreamConnectError, match="closed"):
        await pool.request(b"GET", b"/", [], b"")
    await wait_until(lambda: server.eofs == 1, "the server to see the connection closed")


# -- streaming and timeouts --------------------------------------------------------------------


async def test_chunks_arrive_as_the_server_sends_them(serve: ServeFn) -> None:
    headers_seen, proceed = asyncio.Event(), asyncio.Event()
    second_sent = False

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        nonlocal second_sent
        await server.next_request(reader)
        writer.write(CHUNKED_HEAD)
        await headers_seen.wait()  # so the first chunk reaches a consumer that is already waiting
        writer.write(chunk(b"data: first\n\n"))
        await proceed.wait()
        second_sent = True
        writer.write(chunk(b"data: second\n\n") + LAST_CHUNK)
        await server.wait_eof(reader)

    server = await serve(handler)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"POST", b"/v1/completions", [], b"{}")
        headers_seen.set()
        async with asyncio.timeout(5):
            assert await anext(response) == b"data: first\n\n"
        assert not second_sent
        proceed.set()
        async with asyncio.timeout(5):
            assert [c async for c in response] == [b"data: second\n\n"]
        assert pool.stats().idle == 1


async def test_head_timeout_before_the_first_byte(serve: ServeFn) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        await server.wait_eof(reader)

    server = await serve(silent)
    async with UpstreamPool(server.origin, head_timeout=0.2, read_timeout=0.01) as pool:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UpstreamTimeout, match=r"no response within 0\.2s"):
            await pool.request(b"GET", b"/", [], b"")
        assert 0.19 <= loop.time() - started < 1.5
        assert pool.stats().open == 0
        await wait_until(lambda: server.eofs == 1, "the server to see the connection closed")


async def test_read_timeout_is_an_idle_timeout_mid_body(serve: ServeFn) -> None:
    async def trickle_then_stall(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.next_request(reader)
        writer.write(CHUNKED_HEAD)
        for i in range(6):  # 0.6 s in total, but never more than 0.1 s between chunks
            writer.write(chunk(b"%d" % i))
            await writer.drain()
            await asyncio.sleep(0.1)
        await server.wait_eof(reader)

    server = await serve(trickle_then_stall)
    async with UpstreamPool(server.origin, read_timeout=0.4) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        received = []
        with pytest.raises(UpstreamTimeout, match="body"):
            async for piece in response:
                received.append(piece)
        assert b"".join(received) == b"012345"
        assert pool.stats().open == 0
        await wait_until(lambda: server.eofs == 1, "the server to see the connection closed")


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_server_dying_mid_body_is_upstream_closed(serve: ServeFn, framing: str) -> None:
    async def die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        if framing == "chunked":
            writer.write(CHUNKED_HEAD + chunk(b"0123456789"))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")

    server = await serve(die)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        assert await anext(response) == b"0123456789"
        with pytest.raises(UpstreamClosed):
            await anext(response)
        assert pool.stats().open == 0


async def test_aclose_before_the_end_closes_at_once(serve: ServeFn) -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"tick"))
        await server.wait_eof(reader)

    server = await serve(endless)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        assert await anext(response) == b"tick"
        await response.aclose()
        assert pool.stats().open == 0
        await wait_until(lambda: server.eofs == 1, "the server to see the connection closed", 0.2)


# -- cancellation ------------------------------------------------------------------------------


async def test_cancelling_a_request_waiting_for_headers_closes_it(serve: ServeFn) -> None:
    got_request = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        got_request.set()
        await server.wait_eof(reader)

    server = await serve(silent)
    async with UpstreamPool(server.origin) as pool:
        task = asyncio.create_task(pool.request(b"POST", b"/", [], b"{}"))
        await got_request.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (pool.stats().open, pool.stats().in_use) == (0, 0)
        await wait_until(lambda: server.eofs == 1, "the server to see the connection closed", 0.2)


async def test_cancelling_a_consumer_waiting_for_a_chunk_closes_it(serve: ServeFn) -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.next_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"one"))
        await server.wait_eof(reader)

    server = await serve(stall)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        received: list[bytes] = []

        async def consume() -> None:
            async for piece in response:
                received.append(piece)

        task = asyncio.create_task(consume())
        await wait_until(lambda: received == [b"one"], "the first chunk")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (pool.stats().open, pool.stats().in_use) == (0, 0)
        await wait_until(lambda: server.eofs == 1, "the server to see the connection closed", 0.2)
        await response.aclose()  # harmless after the fact
        assert pool.stats().open == 0


async def test_cancelling_a_connect_keeps_counts_right() -> None:
    with full_backlog() as port:
        async with UpstreamPool(f"http://127.0.0.1:{port}", connect_timeout=5) as pool:
            task = asyncio.create_task(pool.request(b"GET", b"/", [], b""))
            await wait_until(lambda: pool.stats().connecting == 1, "the connect to start")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert pool.stats() == PoolStats(open=0, idle=0, in_use=0, connecting=0, waiting=0)


# -- flow control and large bodies -------------------------------------------------------------

BLOCK = 256 * 1024


def blocks(count: int) -> Iterator[bytes]:
    """Distinct blocks, so a lost, duplicated or reordered block changes the digest."""
    base = os.urandom(BLOCK)
    for i in range(count):
        yield i.to_bytes(8, "big") + base[8:]


async def test_a_consumer_that_does_not_read_stalls_the_server(serve: ServeFn) -> None:
    count = 256  # 64 MiB: more than the kernel buffers on both ends can absorb
    sent = 0
    expected = hashlib.sha256()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        nonlocal sent
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (count * BLOCK))
        for block in blocks(count):
            expected.update(block)
            writer.write(block)
            await writer.drain()
            sent += len(block)
        await server.wait_eof(reader)

    server = await serve(flood)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"GET", b"/", [], b"")
        samples = [-1]

        def stalled() -> bool:
            samples.append(sent)
            return len(samples) > 20 and samples[-20] == sent > 0

        await wait_until(stalled, "the server's writes to stall", timeout=20)
        assert sent < count * BLOCK
        assert response.buffered <= HIGH_WATER + BLOCK  # at most one socket read past the mark
        received = hashlib.sha256()
        total = 0
        async for piece in response:
            received.update(piece)
            total += len(piece)
        assert total == count * BLOCK
        assert received.hexdigest() == expected.hexdigest()
        assert pool.stats().idle == 1


async def test_large_bodies_both_ways_are_intact(serve: ServeFn) -> None:
    payload = b"".join(blocks(16))  # 4 MiB

    async def digest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        while (request := await server.next_request(reader)) is not None:
            if request.target == b"/chunked":
                writer.write(CHUNKED_HEAD)
                for start in range(0, len(payload), 100_003):
                    writer.write(chunk(payload[start : start + 100_003]))
                    await writer.drain()
                writer.write(LAST_CHUNK)
            elif request.target == b"/length":
                writer.write(ok(payload * 2))
            else:
                writer.write(ok(hashlib.sha256(request.body).hexdigest().encode()))

    server = await serve(digest)
    async with UpstreamPool(server.origin) as pool:
        response = await pool.request(b"POST", b"/digest", [], payload)
        assert await response.read() == hashlib.sha256(payload).hexdigest().encode()
        assert await get(pool, b"/chunked") == (200, payload)
        assert await get(pool, b"/length") == (200, payload * 2)
    assert server.connections == 1


# -- the backend's view: a real uvicorn server --------------------------------------------------


@dataclass
class StreamingApp:
    """An SSE endpoint that streams until the client leaves, noting when it saw the disconnect."""

    chunks_sent: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        await receive()  # the request body
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        watcher = asyncio.create_task(self._watch(receive))
        try:
            while not self.disconnected.is_set():
                await send({"type": "http.response.body", "body": b"data: tok\n\n", "more_body": True})
                self.chunks_sent += 1
                await asyncio.sleep(0.01)
        finally:
            watcher.cancel()

    async def _watch(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected.set()


@contextlib.asynccontextmanager
async def uvicorn_server(app: StreamingApp) -> AsyncIterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started, "uvicorn to start", 10)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_backend_sees_the_disconnect_within_200ms_of_aclose() -> None:
    app = StreamingApp()
    async with uvicorn_server(app) as origin, UpstreamPool(origin) as pool:
        response = await pool.request(b"POST", b"/v1/chat/completions", [], b"{}")
        assert response.status == 200
        assert await anext(response) == b"data: tok\n\n"
        assert await anext(response) == b"data: tok\n\n"
        loop = asyncio.get_running_loop()
        closed_at = loop.time()
        await response.aclose()
        await asyncio.wait_for(app.disconnected.wait(), 0.2)
        assert loop.time() - closed_at < 0.2
