"""The peers benchmark's load generator, a process of its own: C keep-alive connections on
loopback, each sending one chat completion after the other until `--duration` seconds or
`--max-requests` in all, whichever comes first. Responses are parsed with httptools; for streams
it counts the SSE token events (`data: [DONE]` apart) and times the first one (TTFT).

Prints one JSON object (see `Stats.result`). It imports nothing heavy: one is started per load.

    python -m router.lab.bench.peers.loadgen --port P --key KEY [--stream] [--tokens 64] \
        [--concurrency 32] [--duration 8] [--stagger-ms 335] [--ack-fd FD]

With `--ack-fd` it writes one byte to that socket for each response head and each token event
received: the backend's lockstep (router/lab/bench/zero_backend.py) waits for them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import httptools

from router.lab.bench.peers.scenarios import MODEL

HOST = "127.0.0.1"


def pct(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q < 1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def request_bytes(port: int, key: str, tokens: int, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say something short."}],
            "max_tokens": tokens,
            "stream": stream,
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Conn(asyncio.Protocol):
    transport: asyncio.Transport

    def __init__(self, ack_fd: int | None = None) -> None:
        self.ack_fd = ack_fd
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[None] | None = None
        self.status = self.events = 0
        self.sent = self.first = 0.0
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.ack(1)

    def ack(self, received: int) -> None:
        if self.ack_fd is not None:
            # A few bytes on a socket the backend keeps reading: the write never blocks.
            os.write(self.ack_fd, b"." * received)

    def on_body(self, body: bytes) -> None:
        # Every proxy here relays the backend's event writes whole, so "data: " is never split
        # across reads: counting per read is exact (and checked: each stream must count `tokens`).
        tokens = body.count(b"data: ") - body.count(b"data: [DONE]")
        if tokens:
            if not self.events:
                self.first = time.perf_counter()
            self.events += tokens
            self.ack(tokens)

    def on_message_complete(self) -> None:
        self.keep_alive = bool(self.parser.should_keep_alive())
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))

    async def exchange(self, raw: bytes) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.status = self.events = 0
        self.sent = time.perf_counter()
        self.transport.write(raw)
        await self.done


@dataclass
class Stats:
    requests: int = 0
    chunks: int = 0
    errors: int = 0
    bad_counts: int = 0
    ttfts_ms: list[float] = field(default_factory=list)
    last_error: str = ""

    def result(self, elapsed: float) -> dict[str, object]:
        out: dict[str, object] = {
            "requests": self.requests,
            "chunks": self.chunks,
            "errors": self.errors,
            "bad_counts": self.bad_counts,
            "elapsed_s": round(elapsed, 4),
            "last_error": self.last_error,
        }
        if self.ttfts_ms:
            out["ttft_p50_ms"] = round(pct(self.ttfts_ms, 0.5), 3)
            out["ttft_p99_ms"] = round(pct(self.ttfts_ms, 0.99), 3)
        return out

    def count(self, conn: Conn, stream: bool, tokens: int) -> None:
        if conn.status != 200:
            self.errors += 1
            self.last_error = f"status {conn.status}"
            return
        self.requests += 1
        if stream:
            self.chunks += conn.events
            self.bad_counts += conn.events != tokens
            if conn.events:
                self.ttfts_ms.append((conn.first - conn.sent) * 1000)


async def run(args: argparse.Namespace) -> dict[str, object]:
    raw = request_bytes(args.port, args.key, args.tokens, args.stream)
    loop = asyncio.get_running_loop()
    stats = Stats()
    budget = [args.max_requests]
    deadline = time.perf_counter() + args.duration

    async def worker(i: int) -> None:
        await asyncio.sleep(args.stagger_ms / 1000 * i / args.concurrency)
        conn: Conn | None = None
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            try:
                if conn is None or conn.transport.is_closing():
                    _, conn = await loop.create_connection(lambda: Conn(args.ack_fd), HOST, args.port)
                await asyncio.wait_for(conn.exchange(raw), args.timeout)
            except (OSError, TimeoutError, httptools.HttpParserError) as err:
                stats.errors += 1
                stats.last_error = repr(err)
                if conn is not None:
                    conn.transport.close()
                conn = None
                continue
            stats.count(conn, args.stream, args.tokens)
            if not conn.keep_alive:
                conn.transport.close()
                conn = None
        if conn is not None:
            conn.transport.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))
    return stats.result(time.perf_counter() - started)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m router.lab.bench.peers.loadgen", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True, help="sent as Authorization: Bearer KEY")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens (the fake backend honours it)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    parser.add_argument("--stagger-ms", type=float, default=0.0, help="connection i starts after i/C of this")
    parser.add_argument("--ack-fd", type=int, help="a socket to acknowledge heads and tokens on")
    args = parser.parse_args(argv)
    import uvloop

    print(json.dumps(uvloop.run(run(args))))


if __name__ == "__main__":
    main()
