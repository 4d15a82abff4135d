"""One keep-alive HTTP/1.1 connection to an upstream: an asyncio Protocol driving httptools.

A connection carries one exchange at a time (no pipelining). Body bytes are handed to the single
consumer through a deque plus a Future that exists only while the consumer is actually waiting, so
a chunk that arrives while the consumer is busy costs one append. The read timeout is an idle
timeout: `data_received` only stamps the time, and one lazily re-armed timer per connection checks
the stamp, so resetting it costs nothing per chunk.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from typing import cast

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from router.errors import (
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from router.proxy.http1 import body_is_delimited

# Past HIGH_WATER buffered body bytes reading pauses, so the kernel buffers fill and the backend's
# writes stall; reading resumes once the consumer drained the buffer to LOW_WATER.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024

# Exchange states.
IDLE = 0  # no exchange: parked in the pool or freshly connected
HEADERS = 1  # request sent, waiting for the status line and headers
BODY = 2  # headers received, body still arriving
DONE = 3  # the whole response arrived (the consumer may still be draining the buffer)


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_buffered",
        "_exc",
        "_head_request",
        "_headers",
        "_interim",
        "_keep_alive",
        "_last_read",
        "_loop",
        "_new_parser_needed",
        "_on_closed",
        "_parser",
        "_paused",
        "_read_timeout",
        "_state",
        "_timer",
        "_transport",
        "_waiter",
        "closed",
        "got_bytes",
        "idle_since",
        "in_pool",
        "status",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        read_timeout: float,
        on_closed: Callable[[UpstreamConnection], None],
    ) -> None:
        self._loop = loop
        self._read_timeout = read_timeout
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        self._parser = HttpResponseParser(self)
        self._new_parser_needed = False
        self._state = IDLE
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.closed = False
        self.in_pool = False
        self.idle_since = 0.0
        # Per exchange; `send` resets them. The body deque is reused: it is empty between exchanges.
        self._head_request = False
        self._interim = False
        self._keep_alive = False
        self._exc: UpstreamError | None = None
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.got_bytes = False

    # -- used by the pool and the response -------------------------------------------------

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return self._headers

    @property
    def buffered(self) -> int:
        """Body bytes received but not yet taken by the consumer."""
        return self._buffered

    @property
    def usable(self) -> bool:
        """Open and between exchanges: safe to send a new request on."""
        transport = self._transport
        # is_closing() covers the gap between abort() and connection_lost().
        return self._state == IDLE and transport is not None and not transport.is_closing()

    @property
    def reusable(self) -> bool:
        """The exchange finished cleanly, its body was consumed and the server allows keep-alive."""
        return (
            self._state == DONE
            and self._keep_alive
            and self._exc is None
            and not self._body
            and not self.closed
        )

    def send(self, head: bytes, body: bytes, *, head_request: bool) -> None:
        transport = self._transport
        assert transport is not None and self._state == IDLE
        if self._new_parser_needed:
            self._parser = HttpResponseParser(self)
            self._new_parser_needed = False
        self._head_request = head_request
        self._interim = False
        self._keep_alive = False
        self._exc = None
        self._headers = []
        self.status = 0
        self.got_bytes = False
        self._state = HEADERS
        self._last_read = self._loop.time()
        if self._timer is None:
            self._arm_timer()
        if not body:
            transport.write(head)
        elif len(body) <= 65536:
            transport.write(head + body)
        else:
            # Avoids copying a large body; uvloop turns this into a single writev.
            transport.writelines((head, body))

    def park(self, now: float) -> None:
        """Return to IDLE after a reusable exchange, so EOF/data while idle are noticed."""
        self._state = IDLE
        self.idle_since = now
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    @property
    def drained(self) -> bool:
        """The whole body arrived and the consumer has taken all of it."""
        return self._state == DONE and not self._body and self._exc is None

    def take(self) -> bytes | None:
        """Every body byte received so far, as one chunk; b"" at the end of the body; None if
        the consumer must wait. One socket read often carries many chunked-encoding pieces
        (dozens of SSE events under load): handing them over together costs the relay one
        write per read instead of one per piece."""
        body = self._body
        if body:
            if len(body) == 1:
                chunk = body.popleft()
            else:
                chunk = b"".join(body)
                body.clear()
            self._buffered -= len(chunk)
            if self._paused and self._buffered <= LOW_WATER:
                self._resume()
            return chunk
        if self._exc is not None:
            raise self._exc
        if self._state == DONE:
            return b""
        return None

    async def next_chunk(self) -> bytes:
        """Like `take`, waiting until there is something to return."""
        while True:
            chunk = self.take()
            if chunk is not None:
                return chunk
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    async def wait_headers(self) -> None:
        # Once the headers are in, a later failure is raised by the body iteration instead.
        while self._state == HEADERS:
            if self._exc is not None:
                raise self._exc
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def abort(self) -> None:
        """Close the socket at once, dropping unread data (the backend sees the client leave)."""
        if self._transport is not None and not self.closed:
            self._transport.abort()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()

    # -- internals -------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume(self) -> None:
        self._paused = False
        self._last_read = self._loop.time()
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()
        if self._timer is None and self._state in (HEADERS, BODY):
            self._arm_timer()

    def _arm_timer(self) -> None:
        self._timer = self._loop.call_at(self._last_read + self._read_timeout, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        # While paused the consumer is the slow side, not the backend: no timeout then.
        if self.closed or self._paused or self._state not in (HEADERS, BODY):
            return
        if self._loop.time() < self._last_read + self._read_timeout:
            self._arm_timer()
            return
        what = "response headers" if self._state == HEADERS else "response body data"
        self._fail(UpstreamTimeout(f"no {what} from the backend within {self._read_timeout:g}s"))

    def _fail(self, exc: UpstreamError) -> None:
        if self._exc is None and self._state in (HEADERS, BODY):
            self._exc = exc
        self.abort()
        self._wake()

    def _complete(self, keep_alive: bool) -> None:
        self._state = DONE
        self._keep_alive = keep_alive
        self._wake()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it the first small write of a stream can wait for a delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state != HEADERS and state != BODY:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self._keep_alive = False
            if state == IDLE:
                self.abort()
            return
        self._last_read = self._loop.time()
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except HttpParserUpgrade:
            self._fail(UpstreamProtocolError("the backend switched protocols"))
        except HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"malformed response from the backend: {exc}"))

    def eof_received(self) -> bool:
        if self._state == BODY and not self._head_request and not body_is_delimited(self._headers):
            self._complete(keep_alive=False)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._exc is None and self._state == HEADERS and not self.got_bytes:
            self._exc = UpstreamConnectError("the backend closed the connection before responding")
        elif self._exc is None and self._state in (HEADERS, BODY):
            self._exc = UpstreamClosed("the backend closed the connection mid-response")
        self._wake()
        self._on_closed(self)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state == HEADERS:  # later calls are trailers, which are dropped
            self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._state != HEADERS:  # a second response nobody asked for
            self._keep_alive = False
            return
        status: int = self._parser.get_status_code()
        if status < 200:
            # An interim response (100 Continue, 103 Early Hints): the real one follows.
            self._interim = True
            self._headers = []
            return
        self.status = status
        self._state = BODY
        if self._head_request:
            # The parser cannot be told the response has no body; finish here and start the
            # next exchange with a fresh parser.
            self._new_parser_needed = True
            self._complete(self._parser.should_keep_alive())
        else:
            self._wake()

    def on_body(self, body: bytes) -> None:
        if self._state != BODY:  # a body after a HEAD response, or of an unasked-for response
            self._keep_alive = False
            return
        if not body:  # b"" means the end of the body to the consumer
            return
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._state == BODY:
            self._complete(self._parser.should_keep_alive())
