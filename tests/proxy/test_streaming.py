"""Streaming through a real router: chunks as they arrive, disconnects, retries, failures."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from tests.conftest import Stack, router_stack
from tests.support.fakebackend import Behaviour
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import free_port

STREAM = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8}
WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def _open_raw(
    url: str, body: dict[str, object], key: str = "user"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = orjson.dumps(body)
    token = auth(key)["authorization"]
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: {token}\r\ncontent-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    return reader, writer


async def test_chunks_reach_the_client_as_the_backend_sends_them(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=6, itl_s=0.08)
    arrivals: list[float] = []
    async with (
        stack.client() as client,
        client.stream("POST", "/v1/chat/completions", json=STREAM, headers=auth("user")) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
    assert len(arrivals) == 6
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Buffering anywhere on the path would bunch the events together; relayed as sent, each
    # arrives roughly one backend gap after the one before.
    assert min(gaps) > 0.04, gaps


async def test_a_finished_request_leaves_no_cycle_of_the_routers_objects(stack: Stack) -> None:
    """A request's objects go when it ends, by their reference counts: a cycle among them would
    leave every request to the cyclic collector, whose passes then grow with the traffic."""
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=6)
    async with stack.client() as client:

        async def both() -> None:
            async with client.stream(
                "POST", "/v1/chat/completions", json=STREAM, headers=auth("user")
            ) as resp:
                assert resp.status_code == 200
                await resp.aread()
            resp = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            assert resp.status_code == 200

        await both()  # first-use objects (connections, metric children) are made here
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept to be read
        try:
            for _ in range(3):
                await both()
            gc.collect()
            found = sorted(
                {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("router.")}
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert found == []


async def test_keepalive_comments_and_done_marker_pass_through(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=5, keepalive_comment_every=2)
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=STREAM, headers=auth("user"))
    assert resp.text.count(": keep-alive\n\n") == 2
    assert resp.text.endswith("data: [DONE]\n\n")


async def test_non_streaming_body_is_passed_through_unchanged(stack: Stack) -> None:
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
    assert resp.status_code == 200
    assert resp.headers["content-length"] == str(len(resp.content))
    assert resp.json()["usage"]["completion_tokens"] == 16


async def _disconnect_case(stack: Stack, body: dict[str, object], read_first: bool) -> float:
    reader, writer = await _open_raw(stack.url, body)
    await stack.wait_until(lambda: bool(stack.seen()))  # the request reached a backend
    if read_first:
        await reader.readuntil(b"data: {")
    closed_at = time.monotonic()
    writer.close()
    seen = None

    def aborted() -> bool:
        nonlocal seen
        seen = next((s for s in stack.seen() if s.disconnected), None)
        return seen is not None

    await stack.wait_until(aborted, timeout=2)
    assert seen is not None and seen.disconnected is not None
    return seen.disconnected - closed_at


async def test_disconnect_mid_stream_closes_upstream_within_200ms(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=1000, itl_s=0.05)
    assert await _disconnect_case(stack, STREAM, read_first=True) < 0.2


async def test_disconnect_before_first_byte_closes_upstream_within_200ms(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(hang_before_headers=True)
    assert await _disconnect_case(stack, STREAM, read_first=False) < 0.2


async def test_disconnect_during_non_streaming_request_closes_upstream_within_200ms(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(ttft_s=30.0)
    assert await _disconnect_case(stack, WHOLE, read_first=False) < 0.2


def _watched_after(after_s: float) -> Callable[[list[str]], dict[str, Any]]:
    return lambda urls: profile(urls, slow_clients={"watch_disconnect_after_s": after_s})


@pytest.mark.parametrize("read_first", [False, True])
async def test_the_routers_server_tells_of_a_disconnect_without_the_watch_delay(read_first: bool) -> None:
    # A minute's delay: only the server's own word can close upstream within 200 ms.
    async with router_stack(shape=_watched_after(60.0)) as stack:
        for b in stack.backends:
            b.behaviour = Behaviour(tokens=1000, itl_s=0.05)
        assert await _disconnect_case(stack, STREAM, read_first=read_first) < 0.2
        # Told by the server: no request waited in the list for a task to listen.
        assert len(stack.state.runtime.watchlist) == 0


async def test_under_another_asgi_server_the_watch_begins_after_its_delay() -> None:
    async with router_stack(shape=_watched_after(0.02), on_uvicorn=True) as stack:
        for b in stack.backends:
            b.behaviour = Behaviour(hang_before_headers=True)
        assert await _disconnect_case(stack, STREAM, read_first=False) < 0.2
    async with router_stack(shape=_watched_after(60.0), on_uvicorn=True) as stack:
        for b in stack.backends:
            b.behaviour = Behaviour(hang_before_headers=True)
        _, writer = await _open_raw(stack.url, STREAM)
        await stack.wait_until(lambda: bool(stack.seen()))
        # The request waits for its watch, a minute away: listened to by nothing yet.
        assert len(stack.state.runtime.watchlist) == 1
        writer.close()


async def test_disconnects_release_every_counter(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=1000, itl_s=0.05)
    await _disconnect_case(stack, STREAM, read_first=True)
    runtime = stack.state.runtime

    async def settled() -> None:
        while any(b.in_flight for p in runtime.pools.values() for b in p.backends) or any(
            lane.in_flight for lane in runtime.lanes.values()
        ):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(settled(), 2)
    assert runtime.active == 0


async def test_retry_on_another_backend_when_one_refuses_connections() -> None:
    dead = f"http://127.0.0.1:{free_port()}"

    def shape(urls: list[str]) -> dict[str, Any]:
        data = profile([dead, *urls])
        # Probes that would take the dead backend out of rotation first, on a slow machine, are
        # kept away: the requests themselves must meet its refused connections.
        data["health"].update(interval_s=600.0, unhealthy_after=100)
        return data

    async with router_stack(n_backends=1, shape=shape) as stack:
        async with stack.client() as client:
            for _ in range(4):
                resp = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
                assert resp.status_code == 200
        assert len(stack.backends[0].seen) == 4
        metrics = stack.state.metrics.exposition().decode()
        assert 'lane_router_upstream_errors_total{backend="' + dead in metrics


async def test_retry_when_a_backend_answers_503_from_its_queue_limit(stack: Stack) -> None:
    stack.backends[0].behaviour = Behaviour(status=503)
    stack.backends[1].behaviour = Behaviour(status=503)
    async with stack.client() as client:
        both_full = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
        stack.backends[1].behaviour = Behaviour()
        retried = [
            await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user")) for _ in range(4)
        ]
    assert both_full.status_code == 503 and "retry-after" in both_full.headers
    assert all(r.status_code == 200 for r in retried)
    assert len(stack.backends[1].seen) == 1 + 4


async def test_no_retry_after_the_first_byte_and_the_stream_ends_with_an_error_event(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=10, die_after_tokens=3)
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=STREAM, headers=auth("user"))
    events = [line for line in resp.text.split("\n\n") if line]
    assert len(events) == 4
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert last["error"]["type"] == "upstream_error"
    assert len(stack.seen()) == 1


async def test_backend_hanging_before_headers_times_out_with_504() -> None:
    def shape(urls: list[str]) -> dict[str, object]:
        data = profile(urls)
        data["pools"]["interactive"]["response_head_timeout_s"] = 0.3
        return data

    async with router_stack(n_backends=1, shape=shape) as stack:
        stack.backends[0].behaviour = Behaviour(hang_before_headers=True)
        async with stack.client() as client:
            started = time.monotonic()
            resp = await client.post("/v1/chat/completions", json=STREAM, headers=auth("user"))
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "upstream_timeout"
        assert time.monotonic() - started < 2
