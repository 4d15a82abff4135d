"""The Python floor of the peers benchmark: a bare asyncio + httptools HTTP/1.1 reverse proxy.

Both sides are `asyncio.Protocol`s; the httptools parsers only find where messages end, so
connections can be reused. Bytes are relayed raw in both directions — each upstream read is
written to the client as it arrives — with no auth, no header rewriting, no pipelining and no
retries: the least any Python proxy on this event loop can do per request and per chunk.
One keep-alive pool per origin (round robin), idle connections dropped after 4 s.

    python -m router.lab.bench.peers.bare_proxy --port P --upstream 127.0.0.1:PORT [--upstream ...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import socket
import time
from collections.abc import Sequence
from typing import cast

import httptools

IDLE_S = 4.0  # below uvicorn's 5 s keep-alive, so the backend never closes a connection we reuse
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
Origin = tuple[str, int]


def _nodelay(transport: asyncio.BaseTransport) -> asyncio.Transport:
    # Small SSE writes would otherwise wait for a delayed ACK.
    transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return cast(asyncio.Transport, transport)


class Upstream(asyncio.Protocol):
    transport: asyncio.Transport

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool, self.origin = pool, origin
        self.parser = httptools.HttpResponseParser(self)
        self.client: Client | None = None
        self.idle_since = 0.0
        self.done = False
        self.keep_alive = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is not None:
            client.transport.write(data)  # relayed as it arrived
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()
            return
        if self.done:
            self.done, self.client = False, None
            if client is not None:
                client.upstream = None
            if self.keep_alive:
                self.pool.release(self)
            else:
                self.transport.close()

    def on_message_complete(self) -> None:
        # Read here: once the parser has moved past the message, it no longer knows.
        self.done, self.keep_alive = True, bool(self.parser.should_keep_alive())

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.forget(self)
        if self.client is not None:
            self.client.upstream = None
            self.client.transport.close()
            self.client = None


class Pool:
    def __init__(self, origins: Sequence[Origin]) -> None:
        self.order = itertools.cycle(origins)
        self.idle: dict[Origin, list[Upstream]] = {origin: [] for origin in origins}

    async def acquire(self) -> Upstream:
        origin = next(self.order)
        idle, now = self.idle[origin], time.monotonic()
        while idle:
            up = idle.pop()
            if now - up.idle_since < IDLE_S and not up.transport.is_closing():
                return up
            up.transport.close()
        loop = asyncio.get_running_loop()
        _, up = await loop.create_connection(lambda: Upstream(self, origin), *origin)
        return up

    def release(self, up: Upstream) -> None:
        up.transport.resume_reading()  # its last client may have paused it
        up.idle_since = time.monotonic()
        self.idle[up.origin].append(up)

    def forget(self, up: Upstream) -> None:
        if up in self.idle[up.origin]:
            self.idle[up.origin].remove(up)


class Client(asyncio.Protocol):
    transport: asyncio.Transport

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: Upstream | None = None
        self.pending: list[bytes] = []  # request bytes read before an upstream was attached
        self.attaching: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()
            return
        if self.upstream is not None:
            self.upstream.transport.write(data)
            return
        self.pending.append(data)
        if self.attaching is None:
            self.attaching = asyncio.get_running_loop().create_task(self._attach())

    async def _attach(self) -> None:
        try:
            up = await self.pool.acquire()
        except OSError:
            self.transport.write(_BAD_GATEWAY)
            self.transport.close()
            return
        finally:
            self.attaching = None
        if self.transport.is_closing():
            self.pool.release(up)
            return
        self.upstream, up.client = up, self
        up.transport.write(b"".join(self.pending))
        self.pending.clear()

    # A client that stops reading pauses the upstream read (the kernel buffers in between).
    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        up, self.upstream = self.upstream, None
        if up is not None:  # the client left mid-exchange: drop the upstream request too
            up.client = None
            up.transport.close()


async def serve(host: str, port: int, origins: Sequence[Origin]) -> None:
    pool = Pool(origins)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(pool), host, port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m router.lab.bench.peers.bare_proxy", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", action="append", required=True, help="HOST:PORT, repeatable")
    args = parser.parse_args(argv)
    origins = [(host, int(port)) for host, port in (u.rsplit(":", 1) for u in args.upstream)]
    import uvloop

    uvloop.run(serve(args.host, args.port, origins))


if __name__ == "__main__":
    main()
