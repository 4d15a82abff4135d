"""TLS termination (router/httpserver/tls.py): handshakes under the head deadline, failures
reported once with their reason, client certificates, a context swapped for new connections,
and ended connections freed by their reference counts. Real TLS clients and plain sockets on
loopback."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from router.httpserver import HttpServer, ServerConfig
from router.httpserver.tls import (
    NO_CLIENT_CERTIFICATE,
    PLAIN_HTTP,
    TIMEOUT,
    TlsTermination,
)
from router.tls.contexts import server_context
from tests.httpserver.apps import echo
from tests.httpserver.raw import Raw, request
from tests.support.tlscerts import Issued, TestCA, serial_of

ROLES = ("cert", "key", "client_ca")


class Failures:
    """The reasons the server reported, and a way to wait for the next one."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self._changed.set()

    async def wait_for(self, count: int) -> list[str]:
        async with asyncio.timeout(10):
            while len(self.reasons) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.reasons


@contextlib.asynccontextmanager
async def tls_server(termination: TlsTermination, **config: float) -> AsyncIterator[HttpServer]:
    server = HttpServer(echo, ServerConfig(graceful_shutdown_s=1.0, **config), ssl=termination)  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.shutdown()


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path)


def _termination(leaf: Issued, failures: Failures, client_ca: Path | None = None) -> TlsTermination:
    return TlsTermination(server_context(leaf.cert, leaf.key, client_ca, roles=ROLES), failures)


async def _get(port: int, context: ssl.SSLContext, path: str = "/") -> tuple[dict[str, object], str]:
    """One request over TLS: what the app saw, and the serial of the certificate served."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        peer = writer.get_extra_info("ssl_object").getpeercert()
        client = Raw(reader, writer)
        client.send(request("GET", path))
        return orjson.loads((await client.response()).body), peer["serialNumber"]
    finally:
        writer.close()


async def test_https_request_reaches_the_app(ca: TestCA) -> None:
    leaf = ca.issue("127.0.0.1")
    async with tls_server(_termination(leaf, Failures())) as server:
        seen, serial = await _get(server.port, ca.client_context(), "/secure")
    assert seen["scheme"] == "https" and seen["path"] == "/secure"
    assert serial == serial_of(leaf)


async def test_plain_http_on_the_tls_port_is_closed_and_does_not_stall_the_server(ca: TestCA) -> None:
    failures = Failures()
    async with tls_server(_termination(ca.issue("127.0.0.1"), failures)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request("GET", "/plain"))
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed, nothing answered in plain text
        writer.close()
        assert await failures.wait_for(1) == [PLAIN_HTTP]
        seen, _ = await _get(server.port, ca.client_context())
    assert seen["path"] == "/"


async def test_a_client_that_never_finishes_its_handshake_is_closed_at_the_head_deadline(ca: TestCA) -> None:
    failures = Failures()
    async with tls_server(_termination(ca.issue("127.0.0.1"), failures), head_timeout_s=0.3) as server:
        silent = await asyncio.open_connection("127.0.0.1", server.port)
        half = await asyncio.open_connection("127.0.0.1", server.port)
        half[1].write(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, never finished
        for reader, writer in (silent, half):
            async with asyncio.timeout(5):
                assert await reader.read() == b""
            writer.close()
        assert await failures.wait_for(2) == [TIMEOUT, TIMEOUT]
        assert server.open_connections == 0


async def test_handshakes_in_progress_count_against_max_connections(ca: TestCA) -> None:
    async with tls_server(_termination(ca.issue("127.0.0.1"), Failures()), max_connections=1) as server:
        _, held = await asyncio.open_connection("127.0.0.1", server.port)  # handshake never sent
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            async with asyncio.timeout(5):
                assert await reader.read() == b""  # refused while the first one holds the slot
            writer.close()
        finally:
            held.close()


async def test_a_client_without_a_certificate_is_refused_when_one_is_required(ca: TestCA) -> None:
    failures = Failures()
    clients = TestCA(ca.ca_file.parent, "clients")
    termination = _termination(ca.issue("127.0.0.1"), failures, client_ca=clients.ca_file)
    async with tls_server(termination) as server:
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await _get(server.port, ca.client_context())
        assert await failures.wait_for(1) == [NO_CLIENT_CERTIFICATE]
        with_cert = ca.client_context(clients.issue("client-a"))
        seen, _ = await _get(server.port, with_cert, "/mtls")
    assert seen["path"] == "/mtls"


async def test_a_swapped_context_serves_new_connections_and_open_ones_keep_theirs(ca: TestCA) -> None:
    first, second = ca.issue("127.0.0.1"), ca.issue("127.0.0.1")
    termination = _termination(first, Failures())
    async with tls_server(termination) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=ca.client_context())
        kept = Raw(reader, writer)
        kept.send(request("GET", "/before"))
        await kept.response()
        termination.context = server_context(second.cert, second.key, None, roles=ROLES)
        _, serial = await _get(server.port, ca.client_context())
        kept.send(request("GET", "/after"))
        again = orjson.loads((await kept.response()).body)
        assert writer.get_extra_info("ssl_object").getpeercert()["serialNumber"] == serial_of(first)
        kept.close()
    assert serial == serial_of(second)
    assert again["path"] == "/after"


async def test_an_ended_tls_connection_leaves_no_cycle_of_the_servers_objects(ca: TestCA) -> None:
    """A connection goes when it ends, by its reference count, and with it its transport and the
    TLS state and buffers the transport holds: a cycle would keep them all until the cyclic
    collector runs, which after a burst of connections is hundreds of MB later."""
    failures = Failures()
    async with tls_server(_termination(ca.issue("127.0.0.1"), failures), head_timeout_s=0.5) as server:
        await _get(server.port, ca.client_context())  # first-use objects are made here
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept to be read
        try:
            await _get(server.port, ca.client_context())  # served, then closed by the client
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello never finished
            async with asyncio.timeout(5):
                assert await reader.read() == b""  # cut at the deadline
            writer.close()
            assert await failures.wait_for(1) == [TIMEOUT]
            async with asyncio.timeout(5):
                while server.open_connections:  # the served one's end reaches the server
                    await asyncio.sleep(0.01)
            gc.collect()
            found = sorted(
                {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("router.")}
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert found == []
