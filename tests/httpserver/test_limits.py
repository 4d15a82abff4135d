"""The connection's limits, on real sockets: head size, header count, the head deadline (slow
and silent clients), the keep-alive idle timeout, the body stall timeout and the connection cap."""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

import orjson
import pytest

from router.app.asgi import Receive, Scope, Send, send_json
from tests.httpserver.apps import Scripted
from tests.httpserver.raw import FedBytes, Raw, ask, request, serving

HEAD_LIMIT = 64 * 1024


async def _health_latencies(port: int, until: asyncio.Future[None]) -> list[float]:
    """GET /health on one kept-alive connection, again and again until `until` resolves."""
    client = await Raw.open(port)
    latencies = []
    try:
        while not until.done():
            started = time.monotonic()
            client.send(request("GET", "/health"))
            resp = await client.response()
            assert resp.status == 200
            latencies.append(time.monotonic() - started)
            await asyncio.wait([until], timeout=0.01)
    finally:
        client.close()
    return latencies


async def test_a_16_mb_header_is_refused_after_64_kib_while_health_stays_fast(monkeypatch: Any) -> None:
    fed = FedBytes().install(monkeypatch)
    async with serving() as server:
        attack_over: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        health = asyncio.create_task(_health_latencies(server.port, attack_over))
        attacker = await Raw.open(server.port)
        big = b"GET / HTTP/1.1\r\nX-Endless" + b"a" * (16 << 20)  # no colon, no line end
        attacker.send(big)
        resp = await attacker.response()
        unsent_when_refused = attacker.writer.transport.get_write_buffer_size()
        assert await attacker.closed() == b""
        async with asyncio.timeout(10):  # the server lets the attacker go only after a linger
            while server.open_connections > 1:
                await asyncio.sleep(0.01)
        attack_over.set_result(None)
        latencies = await health
        attacker.close()

    assert resp.status == 431
    assert resp.headers["connection"] == "close"
    error = orjson.loads(resp.body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "request_header_fields_too_large"
    assert fed.by_client[attacker.port] <= HEAD_LIMIT  # the parser never saw more
    assert unsent_when_refused > 8 << 20  # the client was far from done sending
    assert len(latencies) >= 5
    assert max(latencies) < 0.1, latencies


async def test_a_head_within_the_limit_is_served_and_one_over_it_is_refused() -> None:
    async with serving(max_head_bytes=4096) as server:
        assert (await ask(server.port, request("GET", "/", b"", "X-Fill: " + "a" * 3800))).status == 200
        over = await Raw.open(server.port)
        over.send(request("GET", "/", b"", "X-Fill: " + "a" * 4200))
        assert (await over.response()).status == 431
        assert await over.closed() == b""
        over.close()


async def test_more_headers_than_allowed_get_431() -> None:
    async with serving(max_headers=20) as server:
        headers = [f"X-H{i}: v" for i in range(19)]  # and Host: 20 in all
        assert (await ask(server.port, request("GET", "/", b"", *headers))).status == 200
        over = await Raw.open(server.port)
        over.send(request("GET", "/", b"", *headers, "X-One-Too-Many: v"))
        resp = await over.response()
        assert resp.status == 431
        assert orjson.loads(resp.body)["error"]["code"] == "too_many_headers"
        assert await over.closed() == b""
        over.close()


def _allow_fds(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def _slowloris(port: int) -> tuple[float, bytes]:
    """Send a head one byte a second until the server answers or closes; (seconds the
    connection was open, what the server said)."""
    opened = time.monotonic()  # before the connect: the server's clock starts after it
    client = await Raw.open(port)
    try:
        for byte in request("GET", "/"):
            client.send(bytes([byte]))
            try:
                first = await asyncio.wait_for(client.reader.read(1), 1.0)
            except TimeoutError:
                continue
            answer = first + await client.closed(timeout=15)
            return time.monotonic() - opened, answer
        raise AssertionError("the whole head went out one byte a second and was not refused")
    finally:
        client.close()


async def _silent(port: int) -> tuple[float, bytes]:
    opened = time.monotonic()
    client = await Raw.open(port)
    try:
        answer = await client.closed(timeout=15)
        return time.monotonic() - opened, answer
    finally:
        client.close()


@pytest.mark.timeout(60)
async def test_slow_and_silent_connections_are_closed_at_the_head_deadline() -> None:
    _allow_fds(8000)
    deadline = 1.5
    async with serving(head_timeout_s=deadline) as server:
        slow = [asyncio.create_task(_slowloris(server.port)) for _ in range(200)]
        silent = [asyncio.create_task(_silent(server.port)) for _ in range(2000)]
        slow_results = await asyncio.gather(*slow)
        silent_results = await asyncio.gather(*silent)
        async with asyncio.timeout(10):
            while server.open_connections:
                await asyncio.sleep(0.05)

    for opened, answer in slow_results:
        assert opened >= deadline - 0.1
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b'"code":"request_timeout"' in answer
    for opened, answer in silent_results:
        assert opened >= deadline - 0.1
        assert answer == b""  # nothing received: just closed


async def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    async with serving(keepalive_timeout_s=0.5) as server:
        busy = await Raw.open(server.port)
        for _ in range(4):  # a request every 0.3 s keeps the one connection
            busy.send(request("GET", "/"))
            assert (await busy.response()).status == 200
            await asyncio.sleep(0.3)
        idle = await Raw.open(server.port)
        idle.send(request("GET", "/"))
        assert (await idle.response()).status == 200
        answered = time.monotonic()
        assert await idle.closed() == b""
        assert time.monotonic() - answered >= 0.45
        busy.close()
        idle.close()


async def test_a_body_that_stalls_ends_in_a_disconnect_and_a_close() -> None:
    async def upload(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        got = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                app.note("disconnect", got)
                return
            got += len(message["body"])
            if not message.get("more_body"):
                await send_json(send, 200, {"got": got})
                return

    app = Scripted({"/upload": upload})
    async with serving(app, body_timeout_s=0.5) as server:
        client = await Raw.open(server.port)
        head = request("POST", "/upload", b"x" * 100)[:-90]  # 10 of the 100 bytes, then silence
        client.send(head)
        assert await app.wait_for("disconnect") == 10
        assert await client.closed() == b""
        client.close()


async def test_a_slow_steady_body_is_not_a_stall() -> None:
    async with serving(body_timeout_s=0.5) as server:
        client = await Raw.open(server.port)
        body = b"y" * 10
        client.send(request("POST", "/", body)[:-10])
        for byte in body:
            await asyncio.sleep(0.1)
            client.send(bytes([byte]))
        resp = await client.response()
        assert resp.status == 200
        assert orjson.loads(resp.body)["body"] == "y" * 10
        client.close()


async def test_connections_above_the_cap_are_closed_at_once() -> None:
    async with serving(max_connections=5) as server:
        held = [await Raw.open(server.port) for _ in range(5)]
        for client in held:  # every one accepted and served
            client.send(request("GET", "/"))
            assert (await client.response()).status == 200
        extra = await Raw.open(server.port)
        assert await extra.closed(timeout=5) == b""
        held[0].close()
        async with asyncio.timeout(5):
            while server.open_connections > 4:
                await asyncio.sleep(0.01)
        assert (await ask(server.port, request("GET", "/"))).status == 200
        for client in (*held, extra):
            client.close()
