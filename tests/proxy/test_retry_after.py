"""What a refused client is told to wait, read off raw sockets: a key at its `max_concurrency`
from how long its requests hold their slots; a request refused for want of the shared state from
the time left before Redis is asked again; every backend at its queue limit from what the
backend said."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from typing import Any

import orjson

from tests.conftest import router_stack
from tests.proxy.test_handler_limits import LIMITED, with_limited_key
from tests.proxy.test_hostile_backends import hostile, writes
from tests.support.fakebackend import Behaviour
from tests.support.profiles import KEYS, MODEL

BODY = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


async def raw_post(
    url: str, body: bytes = BODY, path: str = "/v1/chat/completions", key: str = LIMITED
) -> tuple[int, dict[str, str]]:
    """One request with `key`, its status and headers as they came over the socket."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head = raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in head[1:])
    return int(head[0].split()[1]), headers


async def test_a_key_at_its_concurrency_is_told_when_a_slot_frees() -> None:
    async with router_stack(n_backends=1, shape=with_limited_key(max_concurrency=1)) as stack:
        backend = stack.backends[0]
        # A backend that takes two seconds and a bit: the key's one slot is held that long.
        backend.behaviour = Behaviour(tokens=2, ttft_s=2.2)
        began = time.monotonic()
        status, _ = await raw_post(stack.url)
        took = time.monotonic() - began  # at least as long as the router held the slot
        assert status == 200
        release = asyncio.Event()
        backend.behaviour = Behaviour(tokens=2, hold=release)
        held = asyncio.ensure_future(raw_post(stack.url))
        await stack.wait_until(lambda: len(backend.seen) == 2)
        status, headers = await raw_post(stack.url)
        release.set()
        assert (await held)[0] == 200

    assert status == 429
    # One slot, each request holding it about 2.2 s: the next frees about then, not in 1 s.
    assert 3 <= int(headers["retry-after"]) <= math.ceil(took)


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_without_the_shared_state_a_refusal_says_when_redis_is_asked_again() -> None:
    def shape(urls: list[str]) -> dict[str, Any]:
        data: dict[str, Any] = with_limited_key(rpm=100)(urls)
        data["state"] = {
            "redis_url": f"redis://127.0.0.1:{_dead_port()}/0",
            "on_error": "closed",
            "recheck_s": 3.0,
        }
        return data

    async with router_stack(n_backends=1, shape=shape) as stack:
        status, headers = await raw_post(stack.url)
        assert status == 503 and int(headers["retry-after"]) == 3
        # Refused again until Redis is asked again, each told the time left of the 3 s.
        seen = [3]
        async with asyncio.timeout(10):
            while seen[-1] == 3:
                status, headers = await raw_post(stack.url)
                assert status == 503
                seen.append(int(headers["retry-after"]))
    assert 1 <= seen[-1] < 3
    assert seen == sorted(seen, reverse=True)
    assert stack.forwarded() == 0


async def test_a_backend_at_its_queue_limit_passes_on_its_own_retry_after() -> None:
    cases = {b"Retry-After: 7": 7, b"Retry-After: 86400": 60, b"X-Other: 1": 1}
    for field, told in cases.items():
        full = b"HTTP/1.1 503 Service Unavailable\r\n%s\r\nContent-Length: 0\r\n\r\n" % field
        async with hostile(writes(full)) as (stack, servers):
            status, headers = await raw_post(stack.url, key=KEYS["user"])
        assert status == 503 and servers[0].posts, field
        assert headers["retry-after"] == str(told), field
