"""Slow readers through a real router: detected, decoupled, fed every byte, and remembered."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson

from router.config.load import parse_profile
from router.server import build_state
from router.state.live import RouterState
from tests.conftest import router_stack
from tests.support.fakebackend import Behaviour, FakeBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import server_group

TOKENS = 6000


def shape(urls: list[str], **lanes: dict[str, Any]) -> dict[str, Any]:
    data = profile(urls)
    data["slow_clients"] = {"lag_bytes": 16384}
    for cls, extra in lanes.items():
        data["lanes"][cls].update(extra)
    return data


def stream_body(tokens: int = TOKENS) -> bytes:
    return orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": tokens,
        }
    )


@dataclass
class Reading:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (time, body bytes so far)
    caught_up: bool = False  # `until` came true and the client read the rest at full speed


async def read_slowly(
    url: str,
    body: bytes,
    headers: dict[str, str],
    chunk: int = 4096,
    pause: float = 0.05,
    until: Callable[[], bool] | None = None,
) -> Reading:
    """A client with a small receive buffer that reads `chunk` bytes every `pause` seconds, and
    at full speed once `until()` is true. Tying the switch to what the test waits for, rather
    than to a reading speed, keeps the client slower than the backend however busy the machine."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=chunk)
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="POST",
        target="/v1/chat/completions",
        headers=[
            ("host", host),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            *headers.items(),
        ],
    )
    writer.write(conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
    out = Reading()
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if not out.caught_up and until is not None and until():
                    out.caught_up = True
                if not out.caught_up:
                    await asyncio.sleep(pause)
                conn.receive_data(await reader.read(chunk))
                continue
            if isinstance(event, h11.Response):
                out.status = event.status_code
                out.headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                out.body += event.data
                out.timeline.append((time.monotonic(), len(out.body)))
            elif isinstance(event, h11.EndOfMessage):
                return out
    finally:
        writer.close()


def tokens_in(body: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb'"content":" t(\d+)"', body)]


def finished(backend: FakeBackend) -> Callable[[], bool]:
    return lambda: bool(backend.seen) and backend.seen[0].finished is not None


def bytes_read_by(reading: Reading, when: float) -> int:
    return max((n for t, n in reading.timeline if t <= when), default=0)


async def test_a_slow_reader_is_decoupled_gets_every_byte_and_is_remembered() -> None:
    async with router_stack(n_backends=1, shape=shape) as stack:
        backend = stack.backends[0]
        backend.behaviour = Behaviour(tokens=TOKENS)
        headers = {**auth("user"), "x-client-id": "phone-7"}
        reading = await read_slowly(stack.url, stream_body(), headers, until=finished(backend))

        assert reading.status == 200
        assert tokens_in(reading.body) == list(range(TOKENS))
        assert reading.body.endswith(b"data: [DONE]\n\n")
        (seen,) = backend.seen
        assert seen.finished is not None
        # The backend finished long before the client had read its answer.
        assert bytes_read_by(reading, seen.finished) < 0.4 * len(reading.body)
        # With the socket buffers of loopback the whole answer may have been written before the
        # first check: then the lag is found when the stream ends, and remembered all the same.
        metrics = stack.state.metrics
        text = metrics.exposition().decode()
        assert 'lane_router_slow_clients_total{lane="chat"} 1.0' in text
        assert "lane_router_stream_buffer_bytes 0.0" in text
        assert stack.state.runtime.buffers.used == 0

        async with stack.client() as client:
            again = await client.post("/v1/chat/completions", content=stream_body(3), headers=headers)
            other = await client.post(
                "/v1/chat/completions",
                content=stream_body(3),
                headers={**auth("user"), "x-client-id": "pc-1"},
            )
            whole = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                headers=headers,
            )
        assert again.headers["x-lane-router-class"] == "slow_stream"
        assert again.headers["x-lane-router-reason"] == "slow_client"
        assert other.headers["x-lane-router-class"] == "chat"
        assert whole.headers["x-lane-router-class"] == "chat"  # only streams are slow_stream


# The router's client sockets with a 16 KiB send buffer (a constrained path), so a slow reader
# fills them in the middle of an answer instead of at its end.
SMALL_SEND_BUFFER = ((socket.SOL_SOCKET, socket.SO_SNDBUF, 16384),)


@contextlib.asynccontextmanager
async def constrained_router(behaviour: Behaviour) -> AsyncIterator[tuple[str, RouterState]]:
    async with server_group() as group:
        url = await group.start(FakeBackend(behaviour))
        state = build_state(parse_profile(shape([url])), None)
        yield await group.serve_router(state, socket_options=SMALL_SEND_BUFFER), state


async def test_a_client_lagging_mid_stream_is_decoupled_from_then_on() -> None:
    async with constrained_router(Behaviour(tokens=TOKENS)) as (router, state):
        runtime = state.runtime
        headers = {**auth("user"), "x-client-id": "tv-3"}
        # 20 kB/s until the stream buffer holds 64 KiB: only a decoupled stream gets there.
        reading = await read_slowly(
            router, stream_body(), headers, chunk=1024, until=lambda: runtime.buffers.used > 64 * 1024
        )

    assert reading.caught_up  # the rest of the answer went through the stream buffer
    assert tokens_in(reading.body) == list(range(TOKENS))
    assert reading.body.endswith(b"data: [DONE]\n\n")
    assert runtime.buffers.used == 0
    text = state.metrics.exposition().decode()
    assert 'lane_router_slow_clients_total{lane="chat"} 1.0' in text


async def test_a_fast_reader_is_not_decoupled() -> None:
    async with router_stack(n_backends=1, shape=shape) as stack:
        stack.backends[0].behaviour = Behaviour(tokens=500)
        async with stack.client() as client:
            resp = await client.post("/v1/chat/completions", content=stream_body(500), headers=auth("user"))
        assert tokens_in(resp.content) == list(range(500))
        assert "lane_router_slow_clients_total{" not in stack.state.metrics.exposition().decode()


def _decoupled(urls: list[str]) -> dict[str, Any]:
    return shape(urls, slow_stream={"decouple": True})


async def test_a_decoupled_lane_relays_through_the_buffer_from_the_first_byte() -> None:
    async with router_stack(n_backends=1, shape=_decoupled) as stack:
        backend = stack.backends[0]
        backend.behaviour = Behaviour(tokens=TOKENS)
        headers = {**auth("tester"), "x-request-class": "slow_stream"}
        reading = await read_slowly(stack.url, stream_body(), headers, until=finished(backend))

        assert reading.headers["x-lane-router-lane"] == "slow_stream"
        assert tokens_in(reading.body) == list(range(TOKENS))
        (seen,) = backend.seen
        assert seen.finished is not None
        assert bytes_read_by(reading, seen.finished) < 0.4 * len(reading.body)
        # Always decoupled is not a detection: nobody is marked slow.
        assert "lane_router_slow_clients_total{" not in stack.state.metrics.exposition().decode()


async def test_a_backend_failure_in_a_decoupled_stream_ends_it_with_an_error_event() -> None:
    async with router_stack(n_backends=1, shape=_decoupled) as stack:
        stack.backends[0].behaviour = Behaviour(tokens=50, die_after_tokens=20)
        async with stack.client() as client:
            headers = {**auth("tester"), "x-request-class": "slow_stream"}
            resp = await client.post("/v1/chat/completions", content=stream_body(50), headers=headers)
        events = [e for e in resp.content.split(b"\n\n") if e]
        assert tokens_in(resp.content) == list(range(20))
        assert orjson.loads(events[-1].removeprefix(b"data: "))["error"]["type"] == "upstream_error"
        runtime = stack.state.runtime
        assert runtime.buffers.used == 0
        assert all(b.in_flight == 0 for b in runtime.pools["interactive"].backends)


async def test_a_slow_client_leaving_mid_stream_releases_its_buffer() -> None:
    async with constrained_router(Behaviour(tokens=TOKENS)) as (router, state):
        runtime = state.runtime
        task = asyncio.ensure_future(read_slowly(router, stream_body(), auth("user"), pause=0.05))
        async with asyncio.timeout(5):
            while runtime.buffers.used == 0:
                await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        async with asyncio.timeout(5):
            while runtime.buffers.used or any(lane.in_flight for lane in runtime.lanes.values()):
                await asyncio.sleep(0.01)
        assert all(b.in_flight == 0 for b in runtime.pools["interactive"].backends)
        assert "lane_router_stream_buffer_bytes 0.0" in state.metrics.exposition().decode()
