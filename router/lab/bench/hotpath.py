"""The router's own per-request work, without sockets: `handle()` driven with an in-memory
upstream, so an instruction counter sees only the request path's Python.

    python -m router.lab.bench.hotpath whole 1          # compile the sources first
    valgrind --tool=callgrind python -m router.lab.bench.hotpath whole 100
    valgrind --tool=callgrind python -m router.lab.bench.hotpath whole 2100

The difference of the two totals over 2000 is the cost of one request (both runs pay start-up
and 200 warm-up requests alike; a source recompiled between them would count too, hence the
first line). `stream` relays 64 SSE chunks and [DONE]. Run as a file with `PYTHONPATH=TREE` to
measure another tree of the router.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator

import orjson

from router.apiroutes import PROXIED
from router.asgi import Message
from router.auth import hash_key
from router.config.load import parse_profile
from router.metrics import Metrics
from router.proxy.handler import handle
from router.runtime import Runtime, build_runtime

KEY = "hotpath-key"
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
    """The part of `UpstreamResponse` the relay uses, over a fixed list of chunks."""

    def __init__(self, chunks: list[bytes], sse: bool) -> None:
        self.status = 200
        self.headers = [(b"content-type", b"text/event-stream" if sse else b"application/json")]
        self._chunks = list(chunks)
        self.buffered = 0

    @property
    def at_end(self) -> bool:
        return not self._chunks

    async def wait_body(self) -> None:
        return None  # the chunks are in memory: the body has begun

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while self._chunks:
            yield self._chunks.pop(0)

    async def aclose(self) -> None:
        return None


class _Upstream:
    def __init__(self, chunks: list[bytes], sse: bool) -> None:
        self._chunks, self._sse = chunks, sse

    async def request(self, method: bytes, target: bytes, headers: object, body: bytes) -> _Response:
        return _Response(self._chunks, self._sse)

    async def aclose(self) -> None:
        return None


def runtime(stream: bool) -> Runtime:
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
        "keys": [{"name": "k", "sha256": hash_key(KEY)}],
    }
    rt = build_runtime(parse_profile(data), Metrics())
    chunks = [*[_CHUNK] * 64, b"data: [DONE]\n\n"] if stream else [_WHOLE]
    for backend in rt.pools["p"].backends:
        backend.upstream = _Upstream(chunks, stream)  # type: ignore[assignment]
    return rt


async def run(n: int, stream: bool) -> None:
    rt = runtime(stream)
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

    async def receive() -> Message:
        return message

    async def send(m: Message) -> None:
        return None

    for _ in range(n):
        scope: Message = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": headers,
            "client": ("127.0.0.1", 5555),
        }
        await handle(rt, PROXIED[b"/v1/chat/completions"], scope, receive, send)


def main(argv: list[str]) -> int:
    stream, n = argv[0] == "stream", int(argv[1])
    asyncio.run(run(200, stream))
    began = time.process_time()
    asyncio.run(run(n, stream))
    print(f"{argv[0]}: {(time.process_time() - began) / n * 1e6:.1f} µs CPU per request")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
