"""The router's own per-request work, without sockets: `handle()` driven with an in-memory
upstream, so an instruction counter sees only the request path's Python.

    python -m router.lab.bench.hotpath whole 1          # write the bytecode caches first
    valgrind --tool=callgrind python -m router.lab.bench.hotpath whole 100
    valgrind --tool=callgrind python -m router.lab.bench.hotpath whole 2100

The difference of the two totals over 2000 is the cost of one request (both runs pay start-up
and 200 warm-up requests alike; a source byte-compiled between them would count too, hence the
first line). `stream` relays 64 SSE chunks and [DONE]. A third argument `limited` gives the
key rate limits (requests, tokens and concurrency, none of them reached), so the limiter and the
usage tail are counted too. The request's scope offers the server's body writer, as the router's
own HTTP server does. Run as a file with `PYTHONPATH=TREE` to measure another tree of the router.

It measures the interpreted request path only: a compiled one (docs/compiled.md) checks the types
it is handed, and takes neither the stand-in upstream nor its response. Where the tree is compiled,
run it with LANE_ROUTER_INTERPRETED=1; router/lab/bench/wirepath.py measures both builds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from router import BUILD
from router.app.asgi import BODY_WRITER, BodyWriter, Message
from router.app.routes import PROXIED
from router.config.load import parse_profile
from router.keys.auth import hash_key
from router.observe.metrics import Metrics
from router.proxy.handler import handle
from router.proxy.splice import Splice
from router.state.runtime import Runtime, build_runtime

KEY = "hotpath-key"
_LIMITS: dict[str, Any] = {"rpm": 10_000_000, "tpm": 1_000_000_000, "max_concurrency": 100_000}
_CHUNK = (
    b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" t1"},"finish_reason":null}]}\n\n'
)
_WHOLE = orjson.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": " tok" * 16}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 16, "total_tokens": 17},
    }
)


class _Response:
    """The part of `UpstreamResponse` the relay uses, over a fixed list of chunks. Each chunk
    arrives in a loop callback of its own, as each socket read does: iterated, it wakes the
    reading task; attached to a sink (router/proxy/splice.py), it is handed over in the callback."""

    def __init__(self, chunks: list[bytes], sse: bool) -> None:
        self.status = 200
        self.headers = [(b"content-type", b"text/event-stream" if sse else b"application/json")]
        self._chunks: deque[bytes] = deque(chunks)
        self._arrived: deque[bytes] = deque()
        self._sink: Splice | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self.buffered = 0
        self._loop.call_soon(self._read)

    def _read(self) -> None:
        self._arrived.append(self._chunks.popleft())
        if self._chunks:
            self._loop.call_soon(self._read)
        if self._sink is not None:
            self._deliver()
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _deliver(self) -> None:
        sink = self._sink
        assert sink is not None
        data = b"".join(self._arrived)
        self._arrived.clear()
        last = not self._chunks
        if last:
            self._sink = None
        sink.relay(data, last)

    @property
    def at_end(self) -> bool:
        return not self._chunks and not self._arrived

    async def wait_body(self) -> None:
        while not self._arrived:
            self._waiter = self._loop.create_future()
            await self._waiter

    def take_ready(self) -> bytes | None:
        if self._arrived:
            data = b"".join(self._arrived)
            self._arrived.clear()
            return data
        return None if self._chunks else b""

    def attach(self, sink: Splice) -> None:
        self._sink = sink
        if self._arrived:
            self._deliver()

    def detach(self) -> None:
        self._sink = None

    def resume(self) -> None:
        return None

    def __aiter__(self) -> _Response:
        return self

    async def __anext__(self) -> bytes:
        while not self._arrived:
            if not self._chunks:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            await self._waiter
        return self._arrived.popleft()

    async def aclose(self) -> None:
        return None

    def release(self) -> None:
        return None


class _Receive:
    """The request's one body message, then whatever `after` gives."""

    __slots__ = ("_after", "_message")

    def __init__(self, message: Message, after: Callable[[], Awaitable[Message]]) -> None:
        self._message: Message | None = message
        self._after = after

    async def __call__(self) -> Message:
        message, self._message = self._message, None
        return message if message is not None else await self._after()


class _Writer(BodyWriter):
    """The server's `BodyWriter` (router/app/asgi.py) over a client that takes every write."""

    def write_body(self, body: bytes, last: bool) -> bool:
        return False

    def write_chunks(self, framed: bytes, body: bytes) -> bool:
        return False

    def when_writable(self, callback: Callable[[], None]) -> None:
        callback()

    def unsent(self) -> int:
        return 0

    def respond(self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> None:
        return None


class _Upstream:
    def __init__(self, chunks: list[bytes], sse: bool) -> None:
        self._chunks, self._sse = chunks, sse

    async def request_fields(
        self, method: bytes, target: bytes, fields: bytes, lines: int, body: bytes
    ) -> _Response:
        return _Response(self._chunks, self._sse)

    async def aclose(self) -> None:
        return None


def runtime(stream: bool, limited: bool = False) -> Runtime:
    classes = ("chat", "rag", "long_context", "agent", "batch", "slow_stream")
    data = {
        "profile": "hotpath",
        "pools": {
            "p": {
                "backends": ["http://127.0.0.1:9"],
                "model": "m",
                "vllm": {"max_model_len": 4096, "max_num_batched_tokens": 4096},
            }
        },
        "lanes": {c: {"pool": "p"} for c in classes},
        "keys": [{"name": "k", "sha256": hash_key(KEY), **(_LIMITS if limited else {})}],
        # Under an instruction counter on a loaded machine a request can outlast the default delay
        # and start the disconnect watch, which natively it never does: out of reach, the count no
        # longer depends on the load.
        "slow_clients": {"watch_disconnect_after_s": 60},
    }
    rt = build_runtime(parse_profile(data), Metrics())
    chunks = [*[_CHUNK] * 64, b"data: [DONE]\n\n"] if stream else [_WHOLE]
    for backend in rt.pools["p"].backends:
        backend.upstream = _Upstream(chunks, stream)  # type: ignore[assignment]
    return rt


async def run(n: int, stream: bool, limited: bool = False) -> None:
    rt = runtime(stream, limited)
    body = orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 16,
            "stream": stream,
        }
    )
    headers = [
        (b"host", b"x"),
        (b"authorization", b"Bearer " + KEY.encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    message: Message = {"type": "http.request", "body": body, "more_body": False}

    async def after_body() -> Message:
        # The client stays: a disconnect watcher that starts waits, as on a real connection.
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")

    async def send(m: Message) -> None:
        return None

    writer = _Writer()

    for _ in range(n):
        scope: Message = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": headers,
            "client": ("127.0.0.1", 5555),
            "extensions": {BODY_WRITER: writer},
        }
        await handle(rt, PROXIED[b"/v1/chat/completions"], scope, _Receive(message, after_body), send)


def main(argv: list[str]) -> int:
    if BUILD.mode == "compiled":
        print(
            "hotpath measures the interpreted request path: this one runs compiled "
            "(set LANE_ROUTER_INTERPRETED=1, or measure with router/lab/bench/wirepath.py)",
            file=sys.stderr,
        )
        return 2
    stream, n = argv[0] == "stream", int(argv[1])
    limited = argv[2:] == ["limited"]
    asyncio.run(run(200, stream, limited))
    began = time.process_time()
    asyncio.run(run(n, stream, limited))
    print(f"{argv[0]}: {(time.process_time() - began) / n * 1e6:.1f} µs CPU per request")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
