"""TLS termination: each accepted socket's handshake, under the head deadline, before the HTTP
connection (router/httpserver/connection.py) sees it.

A `TlsListener` accepts on the listening sockets itself and hands each new socket to the event
loop's TLS with the context the `TlsTermination` holds at that moment (`connect_accepted_socket`),
so a context swapped in (a reloaded certificate) serves the next connections while open ones keep
theirs. The `Connection` is made only once the handshake completed. A failed one is closed and
reported once, with a reason from a fixed few, to `on_failure` — never per byte or record. A
client that never finishes its handshake is closed at `head_timeout_s`, as one that never
finishes its head would be, and handshakes in progress count against `max_connections`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.httpserver.connection import Connection
    from router.httpserver.context import ServerContext

log = logging.getLogger("lane_router.http")

# The reasons a handshake failed, as `on_failure` is told them.
TIMEOUT = "handshake_timeout"
PLAIN_HTTP = "plain_http"
NO_CLIENT_CERTIFICATE = "no_client_certificate"
BAD_CLIENT_CERTIFICATE = "bad_client_certificate"
PROTOCOL = "protocol_mismatch"
CLOSED = "closed_during_handshake"
FAILED = "handshake_failed"

_PROTOCOL_REASONS = frozenset(
    {
        "UNSUPPORTED_PROTOCOL",
        "WRONG_VERSION_NUMBER",
        "NO_SHARED_CIPHER",
        "NO_PROTOCOLS_AVAILABLE",
        "TLSV1_ALERT_PROTOCOL_VERSION",
        "VERSION_TOO_LOW",
        "NO_APPLICATION_PROTOCOL",
        "TLSV1_ALERT_NO_APPLICATION_PROTOCOL",
    }
)


class TlsTermination:
    """The context new connections are served with, and who hears of failed handshakes."""

    __slots__ = ("context", "on_failure")

    def __init__(self, context: ssl.SSLContext, on_failure: Callable[[str], None] | None = None) -> None:
        self.context = context
        self.on_failure = on_failure

    def failed(self, reason: str) -> None:
        if self.on_failure is not None:
            self.on_failure(reason)


def failure_reason(exc: BaseException) -> str:
    """A failed handshake's reason, one of the module's constants."""
    if isinstance(exc, TimeoutError):
        return TIMEOUT
    if isinstance(exc, ssl.SSLCertVerificationError):
        return BAD_CLIENT_CERTIFICATE
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or ""
        if reason == "HTTP_REQUEST":
            return PLAIN_HTTP
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return NO_CLIENT_CERTIFICATE
        if reason in _PROTOCOL_REASONS:
            return PROTOCOL
        if reason.startswith(("SSLV3_ALERT", "TLSV1_ALERT", "TLSV13_ALERT")) and "CERTIFICATE" in reason:
            return BAD_CLIENT_CERTIFICATE
        if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return CLOSED
        return FAILED
    if isinstance(exc, ConnectionError | EOFError):
        return CLOSED
    return FAILED


class TlsListener:
    """Accepts on `sockets` until closed; each accepted socket's handshake runs in a task of its
    own. Has what the server uses of an `asyncio.Server`: `sockets`, `close`, `wait_closed`."""

    __slots__ = ("_accepting", "_ctx", "_loop", "_make", "handshakes", "sockets", "tls")

    def __init__(
        self,
        tls: TlsTermination,
        ctx: ServerContext,
        loop: asyncio.AbstractEventLoop,
        make_connection: Callable[[], Connection],
        sockets: tuple[socket.socket, ...],
    ) -> None:
        self.tls = tls
        self.sockets = sockets
        self._ctx = ctx
        self._loop = loop
        self._make = make_connection
        self.handshakes: set[asyncio.Task[None]] = set()
        for sock in sockets:
            sock.setblocking(False)
            sock.listen(ctx.config.backlog)  # one already listening (a worker's) takes the backlog
        self._accepting = [loop.create_task(self._accept(sock)) for sock in sockets]

    def _full(self) -> bool:
        ctx = self._ctx
        limit = ctx.config.max_connections
        return ctx.closing or bool(limit and len(ctx.connections) + len(self.handshakes) >= limit)

    async def _accept(self, listening: socket.socket) -> None:
        loop = self._loop
        while True:
            try:
                sock, _ = await loop.sock_accept(listening)
            except OSError as err:  # out of descriptors, say: the next accept may succeed
                log.warning("accepting a connection failed: %s", err)
                await asyncio.sleep(0.1)
                continue
            if self._full():
                sock.close()
                continue
            task = loop.create_task(self._handshake(sock))
            self.handshakes.add(task)
            task.add_done_callback(self.handshakes.discard)

    async def _handshake(self, sock: socket.socket) -> None:
        """The event loop's TLS owns `sock` from here: it closes it whatever ends the handshake."""
        timeout = self._ctx.config.head_timeout_s
        try:
            async with asyncio.timeout(timeout):
                # The loop's own limit only backs ours up.
                await self._loop.connect_accepted_socket(
                    self._make, sock, ssl=self.tls.context, ssl_handshake_timeout=timeout + 1
                )
        except Exception as exc:  # whatever ended it, it is reported once
            self.tls.failed(failure_reason(exc))

    def close(self) -> None:
        """Stop accepting and end the handshakes in progress; the sockets close."""
        for task in (*self._accepting, *self.handshakes):
            task.cancel()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self.handshakes, return_exceptions=True)


def listening_socket(host: str | None, port: int, backlog: int) -> socket.socket:
    """A socket bound to `host`:`port` and listening, as the event loop's servers bind theirs."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
