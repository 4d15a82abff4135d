"""The router in front of backends that misbehave on purpose: oversized or dribbled heads, leaking
headers, refused credentials, resets after the request, deaths between head and body. Each
backend is a raw loopback server writing exactly the bytes a test scripts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from router.observe.accesslog import AccessLog
from tests.conftest import Stack, router_stack
from tests.proxy.rawserver import (
    RawServer,
    Reply,
    Request,
    backend,
    closed_port,
    dribble,
    raw_servers,
    stream_head_field,
    wait_until,
)
from tests.support.profiles import MODEL, auth, profile

WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
STREAM = {**WHOLE, "stream": True}
ANSWER = orjson.dumps({"id": "cmpl-1", "object": "chat.completion", "choices": []})
LABEL = "pool 'interactive' backend 0"


def _head(status: bytes = b"200 OK", *fields: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n"


def _json(status: bytes = b"200 OK", *fields: bytes) -> bytes:
    length = b"Content-Length: %d" % len(ANSWER)
    return _head(status, b"Content-Type: application/json", length, *fields) + ANSWER


def writes(data: bytes, keep: bool = True) -> Reply:
    async def reply(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep

    return reply


# Health probes that never take a backend out of rotation within a test.
NO_EJECTION: Mapping[str, Any] = {"interval_s": 600.0, "unhealthy_after": 100}


@contextlib.asynccontextmanager
async def hostile(
    *replies: Reply | str, on_uvicorn: bool = False, health: Mapping[str, Any] | None = None, **pool: Any
) -> AsyncIterator[tuple[Stack, list[RawServer]]]:
    """A router whose interactive pool has one backend per reply (a string is a backend origin
    as it is, such as a port nobody listens on); `pool` overrides the pool's settings. On
    uvicorn the router relays without the server's body writer, as under any ASGI server.
    `health` overrides the profile's health settings."""
    async with raw_servers() as start:
        servers = [await start(backend(r)) for r in replies if not isinstance(r, str)]
        found = iter(servers)
        origins = [r if isinstance(r, str) else next(found).origin for r in replies]

        def shape(_: list[str]) -> dict[str, Any]:
            data = profile(origins)
            data["pools"]["interactive"].update(pool)
            data["health"].update(health or {})
            return data

        async with router_stack(n_backends=0, shape=shape, on_uvicorn=on_uvicorn) as stack:
            yield stack, servers


async def _post(
    stack: Stack, body: Mapping[str, Any] = WHOLE, headers: Mapping[str, str] | None = None
) -> httpx.Response:
    async with stack.client() as client:
        sent = {**auth("user"), **(headers or {})}
        return await client.post("/v1/chat/completions", json=body, headers=sent)


def _error(resp: httpx.Response, status: int, code: str) -> str:
    """The error message of an envelope, after checking it names no backend address."""
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code
    message: str = error["message"]
    _names_no_address(message)
    return message


def _names_no_address(text: str) -> None:
    assert "127.0.0.1" not in text and "http://" not in text, text


# -- oversized heads ---------------------------------------------------------------------------


def _many_fields(count: int) -> bytes:
    return _head(b"200 OK", *(b"X-F%d: v" % i for i in range(count)), b"Content-Length: 0")


async def _flood(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    await stream_head_field(writer, 1024 * 1024)
    return False


@pytest.mark.parametrize("reply", [_flood, writes(_many_fields(10_000))], ids=["1MB-field", "10000-fields"])
async def test_an_oversized_response_head_is_a_502(reply: Reply) -> None:
    async with hostile(reply) as (stack, servers):
        resp = await _post(stack)
    assert _error(resp, 502, "upstream_protocol_error").startswith(LABEL + ": ")
    assert len(servers[0].posts) == 1


# -- headers the client must not see ------------------------------------------------------------

LEAKY = (
    b"Connection: keep-alive, X-Hop",
    b"X-Hop: internal",
    b"Proxy-Connection: keep-alive",
    b"Keep-Alive: timeout=5",
    b"Set-Cookie: session=backend",
    b'WWW-Authenticate: Bearer realm="vllm"',
    b"X-Powered-By: vllm",
    b"Server: evil-backend",
    b"X-Request-Id: chosen-by-the-backend",
    b"Retry-After: 99",
    b"X-Ratelimit-Remaining-Requests: 7",
)
DROPPED = (
    *("x-hop", "proxy-connection", "keep-alive", "set-cookie", "www-authenticate", "x-powered-by"),
    *("retry-after", "x-ratelimit-remaining-requests"),
)


async def test_only_allowlisted_response_headers_reach_the_client() -> None:
    async with hostile(writes(_json(b"200 OK", *LEAKY))) as (stack, _):
        resp = await _post(stack, headers={"x-request-id": "the-clients-id"})
    assert resp.status_code == 200 and resp.content == ANSWER
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["content-length"] == str(len(ANSWER))
    assert resp.headers["x-request-id"] == "the-clients-id"
    assert resp.headers["x-lane-router-lane"] == "chat"
    assert [name for name in DROPPED if name in resp.headers] == []
    assert resp.headers.get("server") != "evil-backend"


async def test_a_streams_length_is_dropped_because_an_error_event_may_follow() -> None:
    event = b"data: {}\n\n"
    head = _head(b"200 OK", b"Content-Type: text/event-stream", b"Content-Length: %d" % len(event), *LEAKY)
    async with hostile(writes(head + event)) as (stack, _):
        resp = await _post(stack, STREAM)
    assert resp.status_code == 200 and resp.content == event
    assert "content-length" not in resp.headers
    assert [name for name in DROPPED if name in resp.headers] == []


@pytest.mark.parametrize("status", [b"401 Unauthorized", b"403 Forbidden"])
async def test_a_backend_refusing_the_pool_key_is_a_502_counted_and_logged_once(
    status: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = _json(status, b'WWW-Authenticate: Bearer realm="vllm"')
    caplog.set_level(logging.WARNING, logger="lane_router.forward")
    async with hostile(writes(refusal)) as (stack, servers):
        responses = [await _post(stack) for _ in range(3)]
        exposition = stack.state.metrics.exposition().decode()
    for resp in responses:
        assert _error(resp, 502, "upstream_auth_failed").startswith(LABEL + ": ")
        assert "www-authenticate" not in resp.headers
    assert len(servers[0].posts) == 3
    counted = f'backend="{servers[0].origin}",pool="interactive",reason="upstream_auth_failed"}} 3.0'
    assert counted in exposition
    warnings = [r for r in caplog.records if r.name == "lane_router.forward"]
    assert len(warnings) == 1 and servers[0].origin in warnings[0].getMessage()


# -- no replay once the request went out --------------------------------------------------------


async def _reset(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.transport.abort()  # the whole request was read: reset instead of answering
    return False


async def test_a_backend_resetting_after_reading_the_request_gets_it_once() -> None:
    async with hostile(_reset, _reset) as (stack, servers):
        resp = await _post(stack)
        retries = stack.state.metrics.exposition().decode()
    assert _error(resp, 502, "upstream_closed").endswith("closed the connection before responding")
    assert sum(len(s.posts) for s in servers) == 1
    assert 'lane_router_retries_total{pool="interactive"}' not in retries


# -- time bounds ---------------------------------------------------------------------------------


async def _dribble(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    await dribble(writer, _json())  # each byte well within the read timeout
    return False


async def test_a_dribbled_head_is_cut_at_head_read_timeout() -> None:
    async with hostile(_dribble, head_read_timeout_s=0.5, read_timeout_s=5.0) as (stack, _):
        started = time.monotonic()
        resp = await _post(stack)
        elapsed = time.monotonic() - started
    assert _error(resp, 504, "upstream_timeout").startswith(LABEL + ": response head incomplete")
    assert 0.5 <= elapsed < 2.5


async def _slow_whole(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(0.8)  # generating a non-streamed answer: silent for four read timeouts
    writer.write(_json())
    return True


async def test_a_slow_non_streamed_answer_is_not_cut_by_the_read_timeout() -> None:
    async with hostile(_slow_whole, read_timeout_s=0.2, response_head_timeout_s=10.0) as (stack, _):
        resp = await _post(stack)
    assert resp.status_code == 200 and resp.content == ANSWER


async def test_a_silent_backend_is_a_504_at_the_response_head_timeout() -> None:
    async def silent(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await reader.read()  # until the router gives up and closes
        return False

    async with hostile(silent, response_head_timeout_s=0.3) as (stack, _):
        resp = await _post(stack)
    assert _error(resp, 504, "upstream_timeout") == LABEL + ": no response within 0.3s"


async def test_a_head_then_death_before_the_body_is_a_502_not_a_200() -> None:
    head = _head(b"200 OK", b"Content-Type: application/json", b"Content-Length: 100")
    async with hostile(writes(head, keep=False)) as (stack, _):
        resp = await _post(stack)
    assert _error(resp, 502, "upstream_closed").startswith(LABEL + ": ")


async def test_a_stream_cut_short_ends_with_an_error_event_naming_no_address() -> None:
    head = _head(b"200 OK", b"Content-Type: text/event-stream", b"Transfer-Encoding: chunked")
    async with hostile(writes(head + b"9\r\ndata: 1\n\n\r\n", keep=False)) as (stack, _):
        resp = await _post(stack, STREAM)
    assert resp.status_code == 200
    first, error = [e for e in resp.text.split("\n\n") if e]
    assert first == "data: 1"
    message = orjson.loads(error.removeprefix("data: "))["error"]["message"]
    assert message.startswith(LABEL + ": ")
    _names_no_address(message)


async def test_a_refused_connection_names_the_backend_by_its_index() -> None:
    # Probes that would take the backend out of rotation before the request, on a slow machine,
    # come too late to: the request itself meets the refused connection.
    async with hostile(f"http://127.0.0.1:{closed_port()}", health=NO_EJECTION) as (stack, _):
        resp = await _post(stack)
    assert _error(resp, 502, "upstream_connect_error") == LABEL + ": cannot connect: connection refused"


# -- idle connections ----------------------------------------------------------------------------


async def test_idle_upstream_connections_are_closed_before_the_keepalive_expires() -> None:
    answered: list[float] = []
    closed: list[float] = []

    async def answer(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(_json())
        await writer.drain()
        answered.append(time.monotonic())  # the router parks the connection after this
        await reader.read()  # the router's close of this idle connection, seen by the backend
        closed.append(time.monotonic())
        return False

    async with hostile(answer, upstream_keepalive_s=0.4) as (stack, _):
        resp = await _post(stack)
        await wait_until(lambda: bool(closed), "the backend to see its idle connection closed", 3)
    assert resp.status_code == 200
    assert 0.4 - 0.05 <= closed[0] - answered[0] < 0.4 + 0.5


async def test_a_paced_streams_chunks_reach_the_client_as_its_backend_spelled_them() -> None:
    """A paced read of one whole chunk is passed on as it came: every valid spelling of its size
    (upper or lower case hex, leading zeros) must still frame it right for the client."""
    events = [b"data: %d\n\n" % i for i in (1, 10, 11, 12, 13, 100)]
    sizes = [b"9", b"A", b"a", b"0000000a", b"0A", b"b"]
    chunks = [size + b"\r\n" + event + b"\r\n" for size, event in zip(sizes, events, strict=True)]
    acks: asyncio.Queue[None] = asyncio.Queue()

    async def lockstep(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(_head(b"200 OK", b"Content-Type: text/event-stream", b"Transfer-Encoding: chunked"))
        for chunk in [*chunks, b"0\r\n\r\n"]:
            await acks.get()  # the client has the last one: this chunk reaches the router alone
            writer.write(chunk)
            await writer.drain()
        return True

    got: list[str] = []
    stream = {"json": STREAM, "headers": auth("user")}
    async with (
        hostile(lockstep) as (stack, _),
        stack.client() as client,
        client.stream("POST", "/v1/chat/completions", **stream) as resp,
    ):
        assert resp.status_code == 200
        acks.put_nowait(None)
        async for line in resp.aiter_lines():
            if line:
                got.append(line)
                acks.put_nowait(None)
    assert got == [e.decode().strip() for e in events]


# -- a non-streamed answer cut short -------------------------------------------------------------

# 283 bytes of JSON, as a small chat completion is.
WHOLE_ANSWER = b'{"id":"cmpl-2","object":"chat.completion","choices":[],"pad":"%s"}' % (b"x" * 219)


def _framed(chunked: bool, body: bytes, parts: int = 1) -> list[bytes]:
    """A 200 of `body` as the writes that carry it: the head first, then `body` in `parts` pieces
    (each one chunk when `chunked`, then the last chunk)."""
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
    step = -(-len(body) // parts)
    pieces = [body[i : i + step] for i in range(0, len(body), step)]
    if not chunked:
        return [_head(b"200 OK", b"Content-Type: application/json", framing), *pieces]
    head = _head(b"200 OK", b"Content-Type: application/json", framing)
    return [head, *(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces), b"0\r\n\r\n"]


def _cut(chunked: bool, reset: bool, sent: int = 20) -> Reply:
    """The head and the first `sent` body bytes of WHOLE_ANSWER, then a reset or a close."""

    async def reply(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head, *_ = _framed(chunked, WHOLE_ANSWER)
        start = WHOLE_ANSWER[:sent]
        writer.write(head + (b"%x\r\n%s\r\n" % (len(start), start) if chunked else start))
        await writer.drain()
        if reset:
            writer.transport.abort()
        return False

    return reply


async def _post_status(stack: Stack) -> tuple[int, bytes]:
    """The status the client is sent first, then the body it reads (b"" if it was cut: the
    client could not take it for whole)."""
    async with (
        stack.client() as client,
        client.stream("POST", "/v1/chat/completions", json=WHOLE, headers=auth("user")) as resp,
    ):
        status = resp.status_code
        try:
            return status, await resp.aread()
        except httpx.RemoteProtocolError:
            return status, b""


async def _access_lines(stack: Stack, log: Path) -> list[dict[str, Any]]:
    observer = stack.state.runtime.observer
    access = observer.access
    assert access is not None
    observer.access = None

    def closed_and_read() -> bytes:
        access.close()  # writes what is queued
        return log.read_bytes()

    return [orjson.loads(line) for line in (await asyncio.to_thread(closed_and_read)).splitlines()]


def _log_to(stack: Stack, log: Path) -> None:
    stack.state.runtime.observer.access = AccessLog(str(log), 100)


@pytest.mark.parametrize("on_uvicorn", [False, True], ids=["own-server", "uvicorn"])
@pytest.mark.parametrize("reset", [True, False], ids=["reset", "close"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_non_streamed_answer_cut_mid_body_is_a_502_not_a_200(
    chunked: bool, reset: bool, on_uvicorn: bool, tmp_path: Path
) -> None:
    async with hostile(_cut(chunked, reset), _cut(chunked, reset), on_uvicorn=on_uvicorn) as (stack, servers):
        _log_to(stack, tmp_path / "access.log")
        status, body = await _post_status(stack)
        exposition = stack.state.metrics.exposition().decode()
        [line] = await _access_lines(stack, tmp_path / "access.log")
    assert status == 502
    error = orjson.loads(body)["error"]
    assert error["code"] == "upstream_closed"
    assert error["message"].endswith("closed the connection mid-response")
    _names_no_address(error["message"])
    # Sent once: a cut answer is not retried on the other backend.
    assert sum(len(s.posts) for s in servers) == 1
    assert 'lane_router_retries_total{pool="interactive"}' not in exposition
    assert 'pool="interactive",reason="upstream_closed"} 1.0' in exposition
    assert (
        'lane_router_requests_total{class="chat",lane="chat",pool="interactive",status="502"} 1.0'
        in exposition
    )
    assert (line["status"], line["error"], line["bytes_out"]) == (502, "upstream_closed", 0)


def _stall(chunked: bool) -> Reply:
    """The head and one body byte, then silence until the router gives up."""

    async def reply(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head, *_ = _framed(chunked, b"{}")
        writer.write(head + (b"2\r\n{" if chunked else b"{"))
        await writer.drain()
        await reader.read()  # the router's close, once its read timeout passed
        return False

    return reply


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_non_streamed_answer_stalled_mid_body_is_a_504_at_the_read_timeout(
    chunked: bool, tmp_path: Path
) -> None:
    async with hostile(_stall(chunked), read_timeout_s=0.3) as (stack, servers):
        _log_to(stack, tmp_path / "access.log")
        status, body = await _post_status(stack)
        exposition = stack.state.metrics.exposition().decode()
        [line] = await _access_lines(stack, tmp_path / "access.log")
    assert status == 504
    error = orjson.loads(body)["error"]
    assert error["code"] == "upstream_timeout"
    assert error["message"].startswith(LABEL + ": ")
    assert len(servers[0].posts) == 1
    assert 'pool="interactive",reason="upstream_timeout"} 1.0' in exposition
    assert (line["status"], line["error"]) == (504, "upstream_timeout")


def _in_writes(writes: list[bytes], then_close: bool = False) -> Reply:
    """Each of `writes` sent on its own, the backend waiting for it to leave first."""

    async def reply(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        for data in writes:
            writer.write(data)
            await writer.drain()
        return not then_close

    return reply


LARGE = b'{"data":"%s"}' % (b"0123456789abcdef" * (2 * 1024 * 1024 // 16))  # past the held bound


@pytest.mark.parametrize("on_uvicorn", [False, True], ids=["own-server", "uvicorn"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("body", [WHOLE_ANSWER, LARGE], ids=["small", "past-the-held-bound"])
async def test_a_whole_answer_in_many_reads_reaches_the_client_byte_for_byte(
    body: bytes, chunked: bool, on_uvicorn: bool
) -> None:
    writes = _framed(chunked, body, parts=7)
    async with hostile(_in_writes(writes), on_uvicorn=on_uvicorn) as (stack, _):
        status, got = await _post_status(stack)
    assert status == 200 and got == body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_answer_past_the_held_bound_cut_short_drops_the_client_without_an_end(chunked: bool) -> None:
    """Past the bound the head has gone out: a cut then leaves the client a body that never
    ended (no last chunk, fewer bytes than its length), never one it could take for whole."""
    writes = _framed(chunked, LARGE, parts=8)[:-3]  # the head and the first 5/8, then a close
    async with (
        hostile(_in_writes(writes, then_close=True)) as (stack, servers),
        stack.client() as client,
        client.stream("POST", "/v1/chat/completions", json=WHOLE, headers=auth("user")) as resp,
    ):
        assert resp.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await resp.aread()
    assert len(servers[0].posts) == 1


async def test_a_stream_stalled_mid_body_ends_with_an_error_event_at_the_read_timeout() -> None:
    async def stall(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = _head(b"200 OK", b"Content-Type: text/event-stream", b"Transfer-Encoding: chunked")
        writer.write(head + b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await reader.read()
        return False

    async with hostile(stall, read_timeout_s=0.3) as (stack, _):
        resp = await _post(stack, STREAM)
    assert resp.status_code == 200
    first, error = [e for e in resp.text.split("\n\n") if e]
    assert first == "data: 1"
    assert orjson.loads(error.removeprefix("data: "))["error"]["code"] == "upstream_timeout"
