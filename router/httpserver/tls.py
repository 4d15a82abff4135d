"""TLS termination: each accepted socket's handshake, under the head deadline, before the HTTP
connection (router/httpserver/connection.py) sees it.

A `Handshake` is the accepted socket's first protocol. It stops reading at once and runs
`loop.start_tls` with the context the `TlsTermination` holds at that moment, so a context
swapped in (a reloaded certificate) serves the next connections while open ones keep theirs.
Only a completed handshake gets a `Connection`; a failed one is closed and reported once, with
a reason from a fixed few, to `on_failure` — never per byte or per record. A client that never
finishes its handshake is closed at `head_timeout_s`, as one that never finishes its head would
be, and handshakes in progress count against `max_connections`."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from router.httpserver.connection import Connection
    from router.httpserver.context import ServerContext

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


class TlsAcceptor:
    """A server's handshakes in progress; `protocol` is the listener's protocol factory."""

    __slots__ = ("_ctx", "_loop", "_make", "pending", "tls")

    def __init__(
        self,
        tls: TlsTermination,
        ctx: ServerContext,
        loop: asyncio.AbstractEventLoop,
        make_connection: Callable[[], Connection],
    ) -> None:
        self.tls = tls
        self._ctx = ctx
        self._loop = loop
        self._make = make_connection
        self.pending: set[Handshake] = set()

    def protocol(self) -> Handshake:
        return Handshake(self)

    def full(self) -> bool:
        ctx = self._ctx
        limit = ctx.config.max_connections
        return ctx.closing or bool(limit and len(ctx.connections) + len(self.pending) >= limit)

    def close(self) -> None:
        """The server stops: handshakes in progress end now."""
        for handshake in list(self.pending):
            handshake.cancel()

    async def handshake(self, transport: asyncio.Transport, early: EarlyData) -> asyncio.Transport:
        """The TLS transport of `transport`, once its handshake completed in time."""
        timeout = self._ctx.config.head_timeout_s
        async with asyncio.timeout(timeout):
            tls_transport = await self._loop.start_tls(
                transport, early, self.tls.context, server_side=True, ssl_handshake_timeout=timeout + 1
            )
        if tls_transport is None:
            raise ConnectionResetError("closed during the handshake")
        return tls_transport

    def run(self, transport: asyncio.Transport, handshake: Handshake) -> asyncio.Task[None]:
        self.pending.add(handshake)
        return self._loop.create_task(self._serve(transport, handshake))

    async def _serve(self, transport: asyncio.Transport, handshake: Handshake) -> None:
        early = EarlyData()
        try:
            tls_transport = await self.handshake(transport, early)
        except asyncio.CancelledError:
            transport.abort()
            raise
        except Exception as exc:  # whatever ended it, the socket is closed and reported once
            transport.abort()
            self.tls.failed(failure_reason(exc))
            return
        finally:
            self.pending.discard(handshake)
        conn = self._make()
        tls_transport.set_protocol(conn)
        conn.connection_made(tls_transport)
        early.hand_over(conn)


class EarlyData(asyncio.Protocol):
    """Holds what the TLS layer delivers between the handshake's end and the HTTP connection's
    start (the request often comes with the client's last handshake flight), then replays it.
    That is one turn of the event loop, so at most a few records."""

    __slots__ = ("_chunks", "_eof", "_lost")

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._eof = False
        self._lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)

    def eof_received(self) -> bool:
        self._eof = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = (exc,)

    def hand_over(self, conn: Connection) -> None:
        for chunk in self._chunks:
            conn.data_received(chunk)
        self._chunks.clear()
        if self._eof:
            conn.eof_received()
        if self._lost is not None:
            conn.connection_lost(self._lost[0])


class Handshake(asyncio.Protocol):
    """An accepted socket until its handshake runs: it reads nothing."""

    __slots__ = ("_acceptor", "_task")

    def __init__(self, acceptor: TlsAcceptor) -> None:
        self._acceptor = acceptor
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        acceptor = self._acceptor
        if acceptor.full():
            transport.close()
            return
        stream = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        stream.pause_reading()  # no byte may be read before the TLS layer takes the socket over
        self._task = acceptor.run(stream, self)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
