"""CPU cost of the upstream client per request and per streamed chunk, against httpx.

    python -m router.lab.bench.upstream_micro [--requests 3000] [--streams 192]

A loopback HTTP/1.1 server runs in a child process (uvloop + httptools), so the CPU time measured
here (`time.process_time`, this process only) is the client's alone. Scenarios: a small POST with
a Content-Length JSON answer at concurrency 1 and 32, and a 64-chunk SSE stream paced at one chunk
per `--chunk-interval-ms`. Per-chunk cost = (CPU per stream − CPU per small request) / 64.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import httpx
import uvloop
from httptools import HttpRequestParser, HttpResponseParser

from router.proxy.upstream import UpstreamPool

CHUNKS = 64
BODY = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 120 + b'"}],"max_tokens":16}'
HEADERS = [(b"content-type", b"application/json"), (b"accept", b"*/*"), (b"x-request-id", b"abc123")]
SMALL_REPLY = (
    b'{"id":"cmpl-1","object":"chat.completion","choices":[{"message":{"content":"' + b"y" * 80 + b'"}}]}'
)
EVENT = b'data: {"id":"cmpl-1","choices":[{"delta":{"content":"tok"}}]}\n\n'


# -- the loopback server (child process) -----------------------------------------------------


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self._loop = loop
        self._interval = interval
        self._transport: asyncio.Transport | None = None
        self._parser = HttpRequestParser(self)
        self._url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_message_complete(self) -> None:
        url, self._url = self._url, b""
        transport = self._transport
        if transport is None:
            return
        if url.startswith(b"/stream"):
            transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            self._loop.call_later(self._interval, self._send_event, transport, 0)
        else:
            transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(SMALL_REPLY), SMALL_REPLY)
            )

    def _send_event(self, transport: asyncio.Transport, sent: int) -> None:
        if transport.is_closing():
            return
        if sent == CHUNKS:
            transport.write(b"0\r\n\r\n")
            return
        transport.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
        self._loop.call_later(self._interval, self._send_event, transport, sent + 1)


async def _serve(interval: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _ServerProtocol(loop, interval), "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    # Serve until the parent closes our stdin.
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


# -- clients ---------------------------------------------------------------------------------

Call = Callable[[bytes], Awaitable[int]]  # target → chunks seen


def lane_client(pool: UpstreamPool) -> Call:
    async def call(target: bytes) -> int:
        response = await pool.request(b"POST", target, HEADERS, BODY)
        seen = 0
        try:
            async for _ in response:
                seen += 1
        finally:
            await response.aclose()
        return seen

    return call


def httpx_client(client: httpx.AsyncClient) -> Call:
    headers = [(k.decode(), v.decode()) for k, v in HEADERS]

    async def call(target: bytes) -> int:
        seen = 0
        async with client.stream("POST", target.decode(), content=BODY, headers=headers) as response:
            async for _ in response.aiter_raw():
                seen += 1
        return seen

    return call


class _BareConnection(asyncio.Protocol):
    """The floor to compare against: no pool logic, timeouts, flow control or checks."""

    def __init__(self) -> None:
        self._parser = HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def on_message_complete(self) -> None:
        self._done = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def call(self, head: bytes) -> int:
        assert self._transport is not None
        self._done = False
        self._transport.write(head + BODY)
        seen = 0
        while True:
            while self._chunks:
                self._chunks.popleft()
                seen += 1
            if self._done:
                return seen
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


def bare_client(host: str, port: int) -> Call:
    free: list[_BareConnection] = []
    tail = b" HTTP/1.1\r\n" + b"".join(b"%s: %s\r\n" % h for h in HEADERS)
    tail += b"host: %s:%d\r\ncontent-length: %d\r\n\r\n" % (host.encode(), port, len(BODY))

    async def call(target: bytes) -> int:
        if free:
            conn = free.pop()
        else:
            _, conn = await asyncio.get_running_loop().create_connection(_BareConnection, host, port)
        seen = await conn.call(b"POST " + target + tail)
        free.append(conn)
        return seen

    return call


@dataclass(frozen=True)
class Result:
    client: str
    scenario: str
    concurrency: int
    count: int
    cpu_us: float  # client CPU per request, user + system (best of the repeats)
    per_second: float
    chunks_seen: float  # body pieces the consumer saw per request


async def _run(name: str, call: Call, scenario: str, count: int, concurrency: int) -> Result:
    target = b"/small" if scenario == "small POST" else b"/stream"
    share, extra = divmod(count, concurrency)
    seen = 0

    async def worker(n: int) -> None:
        nonlocal seen
        for _ in range(n):
            got = await call(target)
            seen += got

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return Result(
        client=name,
        scenario=scenario,
        concurrency=concurrency,
        count=count,
        cpu_us=cpu / count * 1e6,
        per_second=count / wall,
        chunks_seen=seen / count,
    )


async def _measure(name: str, call: Call, requests: int, streams: int, repeat: int) -> list[Result]:
    await _run(name, call, "small POST", 200, 8)  # warm up connections and code paths
    plan = [
        ("small POST", 1, requests),
        ("small POST", 32, requests),
        (f"{CHUNKS}-chunk stream", 1, max(4, streams // 16)),
        (f"{CHUNKS}-chunk stream", 32, streams),
    ]
    results = []
    for scenario, concurrency, count in plan:
        # Other processes share the machine: the least CPU of a few runs is the steadiest figure.
        runs = [await _run(name, call, scenario, count, concurrency) for _ in range(repeat)]
        results.append(min(runs, key=lambda r: r.cpu_us))
    return results


async def _bench(port: int, args: argparse.Namespace) -> list[Result]:
    origin = f"http://127.0.0.1:{port}"
    results = await _measure("bare", bare_client("127.0.0.1", port), args.requests, args.streams, args.repeat)
    async with UpstreamPool(origin) as pool:
        results += await _measure("lane", lane_client(pool), args.requests, args.streams, args.repeat)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=origin, limits=limits, timeout=60) as client:
        # httpx costs 20-50x more per request: fewer of them keep the run short.
        requests, streams = max(100, args.requests // 6), max(32, args.streams // 4)
        results += await _measure("httpx", httpx_client(client), requests, streams, args.repeat)
    return results


def _table(results: list[Result]) -> str:
    lines = [
        "CPU time of the client process (user + system) per request; best of the repeats",
        f"{'client':<7}{'scenario':<18}{'conc':>5}{'n':>7}{'cpu µs/req':>12}{'req/s':>9}{'pieces':>8}",
    ]
    for r in results:
        lines.append(
            f"{r.client:<7}{r.scenario:<18}{r.concurrency:>5}{r.count:>7}{r.cpu_us:>12.1f}"
            f"{r.per_second:>9.0f}{r.chunks_seen:>8.1f}"
        )
    lines.append("")
    lines.append(f"per-chunk CPU = (stream − small request) / {CHUNKS}")
    for client in dict.fromkeys(r.client for r in results):
        cells = []
        for concurrency in (1, 32):
            mine = [r for r in results if (r.client, r.concurrency) == (client, concurrency)]
            small = next(r for r in mine if r.scenario == "small POST")
            stream = next(r for r in mine if r.scenario.endswith("stream"))
            cells.append(f"c={concurrency}: {(stream.cpu_us - small.cpu_us) / CHUNKS:6.2f} µs")
        lines.append(f"{client:<7}" + "   ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m router.lab.bench.upstream_micro", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=2000, help="small requests per run (httpx: a fifth)")
    parser.add_argument("--streams", type=int, default=128, help="streams per run at concurrency 32")
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario; the least CPU is kept")
    parser.add_argument("--chunk-interval-ms", type=float, default=1.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        uvloop.run(_serve(args.chunk_interval_ms / 1000))
        return 0
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.lab.bench.upstream_micro",
            "--serve",
            f"--chunk-interval-ms={args.chunk_interval_ms}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        results = uvloop.run(_bench(port, args))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
