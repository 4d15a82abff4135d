"""TLS termination: each accepted socket's handshake, under the head deadline, before the HTTP
connection (router/httpserver/connection.py) sees it.

A `TlsListener` accepts on the listening sockets itself and hands each new socket to the event
loop's TLS with the context the `TlsTermination` holds at that moment (`connect_accepted_socket`),
so a context swapped in (a reloaded certificate) serves the next connections while open ones keep
theirs. The `Connection` is made only once the handshake completed. A failed one is closed and
reported once, with a reason from a fixed few, to `on_failure` — never per byte or record. A
client that never finishes its handshake is closed at `head_timeout_s`, as one that never
finishes its head would be, and handshakes in progress count against `max_connections`.

What TLS connections take from the C heap stays in the process once they have ended (see
router/httpserver/heap.py): once TRIM_AFTER of them have ended since the last time, the listener
gives the free memory back, at most every TRIM_EVERY_S, so a burst of connections (or of
handshakes cut at the deadline) leaves the process's memory where it was, whatever the burst."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from router.httpserver.heap import release_free_memory

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

# Free memory goes back to the system once this many TLS connections have ended since the last
# time (tens of MB for a few hundred connections; a few stay in the heap's free lists), checked
# every TRIM_EVERY_S (a release takes milliseconds).
TRIM_AFTER = 64
TRIM_EVERY_S = 1.0

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

    __slots__ = (
        "_accepted",
        "_accepting",
        "_ctx",
        "_loop",
        "_make",
        "_released_at",
        "_trimming",
        "handshakes",
        "sockets",
        "tls",
    )

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
        self._accepted = 0  # sockets handed to a handshake
        self._released_at = 0  # how many connections had ended at the last release
        for sock in sockets:
            sock.setblocking(False)
            sock.listen(ctx.config.backlog)  # one already listening (a worker's) takes the backlog
        self._accepting = [loop.create_task(self._accept(sock)) for sock in sockets]
        self._trimming = loop.create_task(self._trim())

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
            self._accepted += 1
            self.handshakes.add(task)
            task.add_done_callback(self.handshakes.discard)

    async def _handshake(self, sock: socket.socket) -> None:
        """The event loop's TLS owns `sock` from here: it closes it whatever ends the handshake."""
        timeout = self._ctx.config.head_timeout_s
        made: list[Connection] = []

        def make() -> Connection:
            conn = self._make()
            made.append(conn)
            return conn

        try:
            async with asyncio.timeout(timeout):
                # The loop's own limit only backs ours up.
                await self._loop.connect_accepted_socket(
                    make, sock, ssl=self.tls.context, ssl_handshake_timeout=timeout + 1
                )
        except Exception as exc:  # whatever ended it, it is reported once
            self.tls.failed(failure_reason(exc))
            # The loop made the connection before the handshake and tells it nothing when the
            # handshake fails: told here, it lets go of what refers back to it, and goes by its
            # reference count rather than waiting for the cyclic collector.
            for conn in made:
                if conn.transport is None:  # never made: the loop will not tell it
                    conn.connection_lost(exc)

    @property
    def ended(self) -> int:
        """TLS connections accepted that have ended (in their handshake or after it)."""
        return self._accepted - len(self.handshakes) - len(self._ctx.connections)

    async def _trim(self) -> None:
        while True:
            await asyncio.sleep(TRIM_EVERY_S)
            ended = self.ended
            if ended - self._released_at >= TRIM_AFTER:
                self._released_at = ended
                # In a thread: the loop goes on meanwhile (but for its own allocations from the
                # C heap, which wait for the arena being trimmed).
                await asyncio.to_thread(release_free_memory)

    def close(self) -> None:
        """Stop accepting and end the handshakes in progress; the sockets close."""
        for task in (*self._accepting, *self.handshakes, self._trimming):
            task.cancel()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self.handshakes, self._trimming, return_exceptions=True)


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
