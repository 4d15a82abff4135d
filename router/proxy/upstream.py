"""The hot-path upstream client: a keep-alive HTTP/1.1 connection pool to one origin.

    pool = UpstreamPool("http://127.0.0.1:8101")
    response = await pool.request(b"POST", b"/v1/completions", headers, body)
    try:
        async for chunk in response:      # de-chunked body bytes, as each socket read delivers them
            ...
    finally:
        await response.aclose()          # keep-alive if fully read, else the socket closes at once

An `https://` origin is reached over TLS: the connection is handed to the exchange only once
the handshake completed, so a backend whose certificate fails verification never receives a
byte of the request (`UpstreamTlsError`, router/tls/upstream.py).

Idle connections are reused most-recent first, so surplus ones age out after
`idle_expiry`; the backend closing an idle one is noticed at once and it leaves the pool. Keep
`idle_expiry` below the backend's own keep-alive timeout (uvicorn's, under vLLM, is 5 s): a request
written just as the backend closes the connection is lost, and is never sent a second time — the
backend may have started it (`UpstreamClosed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from router.errors import UpstreamConnectError
from router.proxy.http1 import build_head, head_with_fields, parse_origin
from router.proxy.limits import ResponseLimits
from router.proxy.upstream_connection import Lender, UpstreamConnection
from router.proxy.upstream_response import UpstreamResponse
from router.tls.upstream import handshake_failure

# uvloop timers have millisecond resolution; an expiry timer may fire this much early.
_TIMER_SLACK: Final = 0.005


@dataclass(frozen=True, slots=True)
class PoolStats:
    open: int  # established connections: idle + in_use
    idle: int
    in_use: int  # leased to a request or an unfinished response
    connecting: int
    waiting: int  # requests waiting for a free slot


class UpstreamPool(Lender):
    """Keep-alive connection pool to one origin (http://host:port or https://host:port).

    For https, `ssl_context` is the context (default: the system's CAs) and `server_hostname` the
    name sent as SNI and checked against the certificate (default: the origin's host).

    Time and size limits are those of `ResponseLimits`; `head_timeout` defaults to `read_timeout`.
    `label` names the origin in error messages (default: the origin itself); those messages may
    reach clients, so a caller that must not show addresses passes a label without one."""

    def __init__(
        self,
        origin: str,
        *,
        max_connections: int = 1024,
        max_idle: int = 256,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        head_timeout: float | None = None,
        head_read_timeout: float = 10.0,
        idle_expiry: float = 4.0,
        max_head_bytes: int = 64 * 1024,
        max_headers: int = 100,
        label: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        if max_connections < 1 or max_idle < 0:
            raise ValueError("max_connections must be ≥ 1 and max_idle ≥ 0")
        if min(connect_timeout, idle_expiry) <= 0:
            raise ValueError("timeouts and idle_expiry must be > 0")
        self._origin = parse_origin(origin)
        self._label = label if label is not None else str(self._origin)
        self._limits = ResponseLimits(
            head_timeout=read_timeout if head_timeout is None else head_timeout,
            head_read_timeout=head_read_timeout,
            read_timeout=read_timeout,
            max_head_bytes=max_head_bytes,
            max_headers=max_headers,
        )
        self._tls: dict[str, Any] = {}
        if self._origin.tls:
            context = ssl_context if ssl_context is not None else ssl.create_default_context()
            name = server_hostname or self._origin.host
            # The handshake is bounded by the connect timeout around it; this is only a backstop.
            self._tls = {
                "ssl": context,
                "server_hostname": name,
                "ssl_handshake_timeout": connect_timeout + 1,
            }
        self._max_connections = max_connections
        self._max_idle = max_idle
        self._connect_timeout = connect_timeout
        self._idle_expiry = idle_expiry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: deque[UpstreamConnection] = deque()  # oldest left, most recently used right
        self._leased: set[UpstreamConnection] = set()
        self._connecting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"UpstreamPool({str(self._origin)!r})"

    @property
    def origin(self) -> str:
        return str(self._origin)

    def stats(self) -> PoolStats:
        return PoolStats(
            open=len(self._idle) + len(self._leased),
            idle=len(self._idle),
            in_use=len(self._leased),
            connecting=self._connecting,
            waiting=sum(not fut.done() for fut in self._waiters),
        )

    def request(
        self,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
    ) -> Coroutine[Any, Any, UpstreamResponse]:
        """Send the request; return once the status line and headers arrived.

        Raises UpstreamConnectError when the request was never written (refused, connect timeout,
        pool exhausted or closed): only then is it safe to send it elsewhere. Once written it
        is never sent again: UpstreamClosed (the connection closed or reset before or during the
        response head), UpstreamTimeout (no head in time), UpstreamProtocolError (broken or
        oversized head). An idle connection the backend already closed is skipped, not written to.
        A plain function returning the coroutine: one frame fewer on every resume.
        """
        head = build_head(method, target, headers, len(body), self._origin.host_header)
        return self._send(head, body, method == b"HEAD")

    def request_fields(
        self, method: bytes, target: bytes, fields: bytes, lines: int, body: bytes
    ) -> Coroutine[Any, Any, UpstreamResponse]:
        """`request` with its header lines already written (router/proxy/http1.py
        `head_with_fields`): the proxy's own few headers cost no pass over a list."""
        head = head_with_fields(method, target, fields, lines, len(body), self._origin.host_header)
        return self._send(head, body, method == b"HEAD")

    async def _send(self, head: bytes, body: bytes, head_request: bool) -> UpstreamResponse:
        conn = self._lease_idle()
        if conn is None:
            conn = await self._acquire()
        # The exchange in this coroutine, not one of its own: the request's task resumes through
        # one frame fewer when the head arrives.
        try:
            conn.send(head, body, head_request=head_request)
            await conn.wait_headers()
        except BaseException:
            self.give_back(conn)
            raise
        return UpstreamResponse(self, conn)

    async def aclose(self) -> None:
        """Close idle connections, abort leased ones and fail waiting requests."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        while self._idle:
            self._retire(self._idle.popleft())
        for conn in list(self._leased):
            conn.abort()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the waiter re-checks and sees the pool closed

    async def __aenter__(self) -> UpstreamPool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- leasing ---------------------------------------------------------------------------

    async def _acquire(self) -> UpstreamConnection:
        """A connection leased to the caller: an idle one, else a new one once there is room."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            if self._closed:
                raise UpstreamConnectError(f"{self._label}: the connection pool is closed")
            conn = self._lease_idle()  # leaves no idle connection behind when it finds none
            if conn is not None:
                return conn
            if len(self._leased) + self._connecting < self._max_connections:
                break
            if deadline is None:
                deadline = loop.time() + self._connect_timeout
            await self._wait_for_slot(loop, deadline)
        self._connecting += 1
        try:
            conn = await self._connect(loop)
        except BaseException:
            self._connecting -= 1
            self._wake_one()
            raise
        self._connecting -= 1
        if self._closed:  # closed while connecting
            conn.abort()
            raise UpstreamConnectError(f"{self._label}: the connection pool is closed")
        self._leased.add(conn)
        return conn

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> UpstreamConnection:
        conn = UpstreamConnection(loop, self._limits, self._label, self._on_conn_closed)
        origin = self._origin
        try:
            async with asyncio.timeout(self._connect_timeout):
                await loop.create_connection(lambda: conn, origin.host, origin.port, **self._tls)
        except ssl.SSLError as exc:
            raise handshake_failure(exc, self._label) from None
        except TimeoutError:
            msg = f"{self._label}: connecting timed out after {self._connect_timeout:g}s"
            raise UpstreamConnectError(msg) from None
        except OSError as exc:
            raise UpstreamConnectError(f"{self._label}: cannot connect: {_reason(exc)}") from exc
        return conn

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout_at(deadline):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._wake_one()  # pass on the wake-up this waiter can no longer use
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            if isinstance(exc, TimeoutError):
                msg = f"{self._label}: pool exhausted: {self._max_connections} connections in use"
                raise UpstreamConnectError(msg) from None
            raise

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    # -- returning and expiring ------------------------------------------------------------

    def give_back(self, conn: UpstreamConnection) -> None:
        """Take back a leased connection: park it if reusable, otherwise close it at once."""
        self._leased.discard(conn)
        loop = self._loop
        if conn.reusable and not self._closed and len(self._idle) < self._max_idle and loop:
            now = loop.time()
            conn.park(now)
            conn.in_pool = True
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = loop.call_at(now + self._idle_expiry, self._sweep)
        else:
            conn.abort()
        if self._waiters:
            self._wake_one()

    def _lease_idle(self) -> UpstreamConnection | None:
        """The most recently parked live connection, leased; closes expired ones on the way."""
        loop = self._loop
        if loop is None or self._closed:
            return None
        idle = self._idle
        now = loop.time()
        while idle:
            conn = idle.pop()
            conn.in_pool = False
            if conn.usable and now - conn.idle_since < self._idle_expiry:
                self._leased.add(conn)
                return conn
            conn.close()
        return None

    def _retire(self, conn: UpstreamConnection) -> None:
        conn.in_pool = False
        conn.close()

    def _sweep(self) -> None:
        self._sweeper = None
        loop = self._loop
        if loop is None:
            return
        idle = self._idle
        cutoff = loop.time() - self._idle_expiry + _TIMER_SLACK
        while idle and idle[0].idle_since <= cutoff:
            self._retire(idle.popleft())
            self._wake_one()
        if idle:
            self._sweeper = loop.call_at(idle[0].idle_since + self._idle_expiry, self._sweep)

    def _on_conn_closed(self, conn: UpstreamConnection) -> None:
        if conn.in_pool:  # the backend closed a kept-alive connection
            conn.in_pool = False
            with contextlib.suppress(ValueError):
                self._idle.remove(conn)
            self._wake_one()


def _reason(exc: OSError) -> str:
    """What went wrong, without the address the event loop writes into its messages."""
    if isinstance(exc, socket.gaierror):
        return "name resolution failed"
    return os.strerror(exc.errno).lower() if exc.errno and exc.errno > 0 else "connection failed"
