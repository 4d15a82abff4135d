"""Test helpers for router/httpserver/: the server in the test's loop, a raw HTTP/1.1 client that
shows exactly what went over the socket, and a parser that counts the bytes fed to it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httptools

from router.httpserver import HttpServer, ServerConfig
from router.httpserver import reader as reader_module
from tests.httpserver.apps import echo


@contextlib.asynccontextmanager
async def serving(app: Any = echo, **config: Any) -> AsyncIterator[HttpServer]:
    server = HttpServer(app, ServerConfig(**{"graceful_shutdown_s": 2.0, **config}))
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.shutdown()


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    framing: bytes = b""  # a chunked body as it was sent, sizes and terminator included
    head: bytes = b""


@dataclass
class Raw:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    sent: list[bytes] = field(default_factory=list)

    @classmethod
    async def open(cls, port: int) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        return cls(reader, writer)

    @property
    def port(self) -> int:
        local: int = self.writer.get_extra_info("sockname")[1]
        return local

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def response(self, *, head_request: bool = False, timeout: float = 10.0) -> Response:
        async with asyncio.timeout(timeout):
            return await self._read(head_request)

    async def _read(self, head_request: bool) -> Response:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if head_request or status in (100, 204, 304):
            return Response(status, headers, b"", head=head)
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
            return Response(status, headers, body, head=head)
        if headers.get("transfer-encoding") == "chunked":
            body, framing = await self._chunks()
            return Response(status, headers, body, framing, head)
        return Response(status, headers, await self.reader.read(), head=head)

    async def _chunks(self) -> tuple[bytes, bytes]:
        body = bytearray()
        framing = bytearray()
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            framing += size_line
            size = int(size_line.split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)
            framing += data
            if size == 0:
                return bytes(body), bytes(framing)
            body += data[:-2]

    async def closed(self, timeout: float = 10.0) -> bytes:
        """Everything the server still sends before it closes (or resets) the connection."""
        out = bytearray()
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionError):
                while data := await self.reader.read(65536):
                    out += data
        return bytes(out)

    def close(self) -> None:
        self.writer.close()


async def ask(port: int, data: bytes) -> Response:
    """One request on a connection of its own: the response."""
    client = await Raw.open(port)
    try:
        client.send(data)
        return await client.response()
    finally:
        client.close()


def request(method: str, path: str, body: bytes = b"", *headers: str, version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: test", *headers]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class FedBytes:
    """Installs a request parser that counts, per client port, the bytes the server fed it."""

    def __init__(self) -> None:
        self.by_client: defaultdict[int, int] = defaultdict(int)

    def install(self, monkeypatch: Any) -> FedBytes:
        counts = self.by_client

        class CountingParser:
            def __init__(self, protocol: Any) -> None:
                self._protocol = protocol
                self._parser = httptools.HttpRequestParser(protocol)

            def feed_data(self, data: bytes | memoryview) -> None:
                client = self._protocol.endpoints[1]
                counts[client[1] if client else 0] += len(data)
                self._parser.feed_data(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._parser, name)

        monkeypatch.setattr(reader_module, "HttpRequestParser", CountingParser)
        return self
