"""One keep-alive HTTP/1.1 connection to an upstream: an asyncio Protocol driving httptools.

A connection carries one exchange at a time (no pipelining). Body bytes are handed to the single
consumer through a deque plus a Future that exists only while the consumer is actually waiting, so
a chunk that arrives while the consumer is busy costs one append — or, with a `BodySink`
attached, straight from the read callback, once per socket read, with no task woken at all.

The time limits of `ResponseLimits` are deadlines watched by one lazily re-armed timer per
connection (`DeadlineTimer`): a body read only stamps its time, and the timer, when it fires,
re-arms itself at the deadline the stamps give by then. It is moved earlier only where a deadline
shortens — at the request, at the head's first byte, at the head's end: a few times per exchange,
never per chunk.

The response head is bounded as it arrives: its bytes and fields are counted in the head state
only, and past a limit the connection is aborted before more of it is buffered.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from router.errors import UpstreamClosed, UpstreamError, UpstreamProtocolError, UpstreamTimeout
from router.proxy.http1 import body_is_delimited
from router.proxy.limits import BEFORE_HEAD, IN_BODY, IN_HEAD, DeadlineTimer, ResponseLimits

# Past HIGH_WATER buffered body bytes reading pauses, so the kernel buffers fill and the backend's
# writes stall; reading resumes once the consumer drained the buffer to LOW_WATER.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024

# Exchange states.
IDLE = 0  # no exchange: parked in the pool or freshly connected
HEADERS = 1  # request sent, waiting for the status line and headers
BODY = 2  # headers received, body still arriving
DONE = 3  # the whole response arrived (the consumer may still be draining the buffer)


class BodySink(Protocol):
    """Takes a response body as it is read (router/proxy/splice.py)."""

    def relay(self, data: bytes, last: bool) -> bool:
        """One read's body bytes (`last`: the body ended with them); False to stop reading
        until the sink calls `UpstreamConnection.resume_sink`."""
        ...

    def failed(self, exc: UpstreamError) -> None:
        """The exchange failed; nothing more will come."""
        ...


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_buffered",
        "_exc",
        "_framing_bytes",
        "_head_bytes",
        "_head_request",
        "_head_since",
        "_headers",
        "_interim",
        "_keep_alive",
        "_label",
        "_last_read",
        "_limits",
        "_loop",
        "_new_parser_needed",
        "_on_closed",
        "_parser",
        "_paused",
        "_sink",
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
        limits: ResponseLimits,
        label: str,
        on_closed: Callable[[UpstreamConnection], None],
    ) -> None:
        self._loop = loop
        self._limits = limits
        self._label = label  # names the backend in error messages, which clients may see
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        self._parser = HttpResponseParser(self)
        self._new_parser_needed = False
        self._state = IDLE
        self._timer = DeadlineTimer(loop, self._on_timer)
        self._last_read = 0.0  # the latest body read
        self._waiter: asyncio.Future[None] | None = None
        self._sink: BodySink | None = None
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
        self._head_since = 0.0  # the request's write, then the head's first byte
        self._head_bytes = 0
        self._framing_bytes = 0
        self.status = 0
        self.got_bytes = False  # a byte of the response arrived

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
        self._head_bytes = 0
        self._framing_bytes = 0
        self.status = 0
        self.got_bytes = False
        self._state = HEADERS
        self._head_since = now = self._loop.time()
        self._timer.arm_by(self._limits.deadline(BEFORE_HEAD, now))
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
        while (chunk := self.take()) is None:
            await self._changed()
        return chunk

    async def wait_headers(self) -> None:
        # Once the headers are in, a later failure is raised by the body iteration instead.
        while self._state == HEADERS:
            await self._changed()

    async def wait_body(self) -> None:
        """Until a body byte arrived or the body ended; a failure before either is raised."""
        while self._state == BODY and not self._body:
            await self._changed()

    def attach(self, sink: BodySink) -> None:
        """Hand every body byte from now on to `sink`, starting with what is already here."""
        self._sink = sink
        if self._body or self._state == DONE or self._exc is not None:
            self._deliver()

    def detach(self) -> None:
        """Body bytes wait in the buffer again, for `take` (which pauses reading by itself when
        they pile up: a pause the sink asked for ends here)."""
        self._sink = None
        if self._paused and not self._body:
            self._resume()

    def resume_sink(self) -> None:
        if self._sink is not None and self._paused:
            self._resume()

    def _deliver(self) -> None:
        sink = self._sink
        assert sink is not None
        body = self._body
        chunk = b""
        if body:
            chunk = body.popleft() if len(body) == 1 else b"".join(body)
            body.clear()
            self._buffered = 0
        exc = self._exc
        if exc is not None:
            self._sink = None
            if chunk:
                sink.relay(chunk, False)
            sink.failed(exc)
            return
        last = self._state == DONE
        if last:
            self._sink = None
        if not sink.relay(chunk, last) and not last:
            self._sink_full()

    def _sink_full(self) -> None:
        """The sink asked to stop: reading pauses until it calls `resume_sink`."""
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def abort(self) -> None:
        """Close the socket at once, dropping unread data (the backend sees the client leave)."""
        if self._transport is not None and not self.closed:
            self._transport.abort()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()

    # -- internals -------------------------------------------------------------------------

    async def _changed(self) -> None:
        """Wait for the next event of the exchange; raise its failure if it already failed."""
        if self._exc is not None:
            raise self._exc
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume(self) -> None:
        self._paused = False
        self._last_read = self._loop.time()
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()
        if self._state == BODY:
            self._timer.arm_by(self._limits.deadline(IN_BODY, self._last_read))

    def _on_timer(self) -> None:
        # While paused the consumer is the slow side, not the backend: no timeout then.
        state = self._state
        if self.closed or self._paused or (state != HEADERS and state != BODY):
            return
        if state == BODY:
            phase, since = IN_BODY, self._last_read
        else:
            phase, since = (IN_HEAD if self.got_bytes else BEFORE_HEAD), self._head_since
        deadline = self._limits.deadline(phase, since)
        if self._loop.time() < deadline:
            self._timer.arm_by(deadline)
            return
        self._fail(UpstreamTimeout(f"{self._label}: {self._limits.timed_out(phase)}"))

    def _fail(self, exc: UpstreamError) -> None:
        if self._exc is None and self._state in (HEADERS, BODY):
            self._exc = exc
        self.abort()
        self._wake()
        if self._sink is not None and self._exc is not None:
            self._deliver()

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
        if state == BODY:
            # A stream's every read comes here: the parser is fed inline (not through `_feed`),
            # and its body goes to the sink at once.
            self._last_read = self._loop.time()
            before = self._buffered
            try:
                self._parser.feed_data(data)
            except (HttpParserError, HttpParserUpgrade) as exc:
                self._parse_failed(exc)
            if self._buffered == before and self._state == BODY:
                self._framing_received(len(data))
            else:
                self._framing_bytes = 0
                sink = self._sink
                if sink is None:
                    return
                body = self._body
                if len(body) == 1 and self._state == BODY and self._exc is None:
                    # A paced stream's read: one piece, and the body goes on. Handed over here,
                    # without `_deliver`'s joining and end-of-body checks.
                    self._buffered = 0
                    if not sink.relay(body.popleft(), False):
                        self._sink_full()
                else:
                    self._deliver()
        elif state == HEADERS:
            self._head_received(data)
        else:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self._keep_alive = False
            if state == IDLE:
                self.abort()

    def _head_received(self, data: bytes) -> None:
        """Feed bytes that begin inside the head; no more than `max_head_bytes` of a head reach
        the parser, which would otherwise keep growing each field it has not finished."""
        limits = self._limits
        if not self.got_bytes:
            self.got_bytes = True
            self._head_since = now = self._loop.time()
            self._timer.arm_by(limits.deadline(IN_HEAD, now))
        room = limits.max_head_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            self._feed(data)
            return
        view = memoryview(data)
        self._head_bytes = limits.max_head_bytes
        self._feed(view[:room])
        if self._state == HEADERS:
            msg = f"{self._label}: response head larger than {limits.max_head_bytes} bytes"
            self._fail(UpstreamProtocolError(msg))
            return
        self._feed(view[room:])  # the head ended in time; the rest is body

    def _framing_received(self, size: int) -> None:
        """Bytes after the head that carried no body: chunk sizes, extensions and trailers. The
        parser keeps a trailer field whole until it ends, so they are bounded like a head."""
        self._framing_bytes += size
        if self._framing_bytes > self._limits.max_head_bytes:
            limit = self._limits.max_head_bytes
            self._fail(
                UpstreamProtocolError(f"{self._label}: over {limit} bytes of chunk framing or trailers")
            )

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as exc:
            self._parse_failed(exc)

    def _parse_failed(self, exc: HttpParserError | HttpParserUpgrade) -> None:
        if isinstance(exc, HttpParserUpgrade):
            self._fail(UpstreamProtocolError(f"{self._label}: the backend switched protocols"))
        else:
            # A limit hit inside a parser callback has already failed the exchange with its reason.
            self._fail(UpstreamProtocolError(f"{self._label}: malformed response: {exc}"))

    def eof_received(self) -> bool:
        if self._state == BODY and not self._head_request and not body_is_delimited(self._headers):
            self._complete(keep_alive=False)
            if self._sink is not None:
                self._deliver()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._timer.cancel()
        state = self._state
        if self._exc is None and state in (HEADERS, BODY):
            # The request went out: the backend may be running it, so this is no connect error
            # (those are retried) whether or not a response byte came back.
            if state == BODY:
                what = "mid-response"
            elif self.got_bytes:
                what = "in the middle of the response head"
            else:
                what = "before responding"
            self._exc = UpstreamClosed(f"{self._label}: the backend closed the connection {what}")
        self._wake()
        if self._sink is not None and self._exc is not None:
            self._deliver()
        self._on_closed(self)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state != HEADERS:  # trailers, which are dropped
            return
        headers = self._headers
        headers.append((name, value))
        if len(headers) > self._limits.max_headers:
            err = UpstreamProtocolError(
                f"{self._label}: more than {self._limits.max_headers} response header fields"
            )
            self._fail(err)
            raise err  # stops the parser

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
            self._last_read = now = self._loop.time()
            self._timer.arm_by(self._limits.deadline(IN_BODY, now))
            self._wake()

    def on_body(self, body: bytes) -> None:
        if self._state != BODY:  # a body after a HEAD response, or of an unasked-for response
            self._keep_alive = False
            return
        if not body:  # b"" means the end of the body to the consumer
            return
        self._body.append(body)
        buffered = self._buffered = self._buffered + len(body)
        if buffered > HIGH_WATER and not self._paused and self._transport is not None:
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
