"""Loopback HTTP/1.1 servers that write exactly the bytes a test scripts, for the upstream client
and for the router facing a hostile backend. Each counts what it sees."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from router.proxy.upstream import UpstreamPool


@dataclass
class Request:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    raw: bytes


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """One request with a Content-Length (or no) body; None at a clean EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    lines = head[:-4].split(b"\r\n")
    method, target, _ = lines[0].split(b" ", 2)
    headers = [(k, v.strip()) for k, v in (line.split(b":", 1) for line in lines[1:])]
    length = next((int(v) for k, v in headers if k.lower() == b"content-length"), 0)
    body = await reader.readexactly(length)
    return Request(method, target, headers, body, head + body)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "RawServer"], Awaitable[None]]


@dataclass
class RawServer:
    """A loopback server whose connections each run `handler`; it counts what it sees."""

    handler: Handler
    connections: int = 0
    requests: list[Request] = field(default_factory=list)
    eofs: int = 0  # connections on which the handler observed the client's EOF/reset
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    port: int = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == b"POST"]

    async def next_request(self, reader: asyncio.StreamReader) -> Request | None:
        request = await read_request(reader)
        if request is not None:
            self.requests.append(request)
        return request

    async def wait_eof(self, reader: asyncio.StreamReader) -> None:
        """Drain until the client closes the connection, then count it."""
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.eofs += 1

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client left, or the test is over
        finally:
            writer.close()
            self._tasks.discard(task)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


ServeFn = Callable[[Handler], Awaitable[RawServer]]


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 2.0) -> None:
    """Poll `condition` until it holds; fail the test if it does not within `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


async def echo_target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
    """Keep-alive server answering every request with its own target."""
    while (request := await server.next_request(reader)) is not None:
        writer.write(ok(b"you asked for " + request.target))
    server.eofs += 1


async def get(pool: UpstreamPool, target: bytes = b"/") -> tuple[int, bytes]:
    response = await pool.request(b"GET", target, [], b"")
    try:
        return response.status, await response.read()
    finally:
        await response.aclose()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def raw_servers() -> AsyncIterator[ServeFn]:
    """Start servers with the function yielded; all are closed when the block ends."""
    servers: list[RawServer] = []

    async def start(handler: Handler) -> RawServer:
        server = RawServer(handler)
        await server.start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            await server.aclose()


Reply = Callable[[Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


def backend(reply: Reply) -> Handler:
    """A keep-alive backend for the router: `GET /health` answers 200 (other GETs 404, so the
    router's drift check finds nothing to compare) and every POST gets `reply`, which returns
    whether the connection stays open."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        while (request := await server.next_request(reader)) is not None:
            if request.method != b"POST":
                status = b"200 OK" if request.target == b"/health" else b"404 Not Found"
                writer.write(b"HTTP/1.1 %s\r\nContent-Length: 2\r\n\r\n{}" % status)
            elif not await reply(request, reader, writer):
                return

    return handler


async def stream_head_field(writer: asyncio.StreamWriter, size: int) -> int:
    """Write a status line and one header field `size` bytes long, in 64 KiB writes that wait for
    the peer; return the bytes written when the peer went away (or all of them)."""
    writer.write(b"HTTP/1.1 200 OK\r\nX-Big: ")
    block = b"a" * 65536
    written = 0
    try:
        while written < size:
            writer.write(block)
            await writer.drain()
            written += len(block)
    except ConnectionError:
        pass
    return written


Page = bytes | Callable[[asyncio.StreamWriter], Awaitable[None]]


def pages(answers: dict[bytes, Page]) -> Handler:
    """A keep-alive server answering each GET target with the response bytes given for it (404
    for others); a callable answer writes the response itself, and the connection then closes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        while (request := await server.next_request(reader)) is not None:
            answer = answers.get(request.target, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            if isinstance(answer, bytes):
                writer.write(answer)
                continue
            await answer(writer)
            return

    return handler


async def dribble(writer: asyncio.StreamWriter, data: bytes, pause: float = 0.05) -> None:
    """Write `data` a byte at a time, `pause` apart, until done or the peer is gone."""
    for byte in data:
        if writer.transport.is_closing():
            return
        writer.write(bytes([byte]))
        await asyncio.sleep(pause)
