"""The body side of one upstream exchange: the state every exchange shares and the one consumer
it hands the response body to (router/proxy/upstream_connection.py parses the bytes).

Body bytes reach the consumer through a deque plus a Future that exists only while the consumer
is actually waiting, so a chunk that arrives while the consumer is busy costs one append — or,
with a sink attached (router/proxy/splice.py), straight from the read callback, once per socket
read, with no task woken at all. Past HIGH_WATER buffered bytes reading pauses until the
consumer drains them."""

from __future__ import annotations

import asyncio
import socket
from abc import ABC, abstractmethod
from collections import deque
from typing import Final, NewType, cast

from router.errors import UpstreamError
from router.proxy.limits import IN_BODY, DeadlineTimer, ResponseLimits

# Past HIGH_WATER buffered body bytes reading pauses, so the kernel buffers fill and the backend's
# writes stall; reading resumes once the consumer drained the buffer to LOW_WATER.
HIGH_WATER: Final = 256 * 1024
LOW_WATER: Final = 64 * 1024

# Exchange states: a type of their own, so mypy refuses another vocabulary's values here (a
# NewType costs nothing compiled: it is its base type there).
UpstreamState = NewType("UpstreamState", int)
UPSTREAM_IDLE: Final = UpstreamState(0)  # no exchange: parked in the pool or freshly connected
UPSTREAM_HEADERS: Final = UpstreamState(1)  # request sent, waiting for the status line and headers
UPSTREAM_BODY: Final = UpstreamState(2)  # headers received, body still arriving
# The whole response arrived (the consumer may still be draining the buffer).
UPSTREAM_DONE: Final = UpstreamState(3)


class BodySink(ABC):
    """What a response body is handed to as it is read, once attached (router/proxy/splice.py is
    the one there is; its methods say what each call means). A base class, not a protocol:
    compiled, the read callback's calls are then direct ones, not calls by name; mypy refuses a
    sink without each of its methods."""

    __slots__ = ("sample_at",)

    sample_at: float  # when the client's lag is next due to be sampled (loop time)

    @abstractmethod
    def record(self, data: bytes) -> float: ...

    @abstractmethod
    def write(self, data: bytes, last: bool) -> bool: ...

    @abstractmethod
    def write_framed(self, framed: bytes, data: bytes) -> bool: ...

    @abstractmethod
    def relay(self, data: bytes, last: bool) -> bool: ...

    @abstractmethod
    def sample(self, data: bytes, now: float) -> bool: ...

    @abstractmethod
    def filled(self) -> bool: ...

    @abstractmethod
    def failed(self, exc: UpstreamError) -> None: ...


class UpstreamBody(asyncio.Protocol):
    """An exchange's state and its body's consumer side; the connection subclass feeds it."""

    __slots__ = (
        "_body",
        "_buffered",
        "_exc",
        "_keep_alive",
        "_last_read",
        "_limits",
        "_loop",
        "_now",
        "_paused",
        "_pieces",
        "_sink",
        "_state",
        "_timer",
        "_transport",
        "_waiter",
        "closed",
        "idle_since",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: ResponseLimits, timer: DeadlineTimer) -> None:
        self._loop = loop
        # Bound once: a stream reads the clock on every read, and a lookup by name costs more.
        self._now = loop.time
        self._limits = limits
        self._timer = timer
        self._transport: asyncio.Transport | None = None
        self._state = UPSTREAM_IDLE
        self._last_read = 0.0  # the latest body read
        self._waiter: asyncio.Future[None] | None = None
        self._sink: BodySink | None = None
        self._paused = False
        self.closed = False
        self.idle_since = 0.0
        # Per exchange. The body deque is reused: it is empty between exchanges.
        self._exc: UpstreamError | None = None
        self._keep_alive = False
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._pieces: list[bytes] = []  # body pieces the parser produced, not yet in `_body`

    @property
    def usable(self) -> bool:
        """Open and between exchanges: safe to send a new request on."""
        transport = self._transport
        # is_closing() covers the gap between abort() and connection_lost().
        return self._state == UPSTREAM_IDLE and transport is not None and not transport.is_closing()

    @property
    def reusable(self) -> bool:
        """The exchange finished cleanly, its body was consumed and the server allows keep-alive."""
        return (
            self._state == UPSTREAM_DONE
            and self._keep_alive
            and self._exc is None
            and not self._body
            and not self.closed
        )

    @property
    def buffered(self) -> int:
        """Body bytes received but not yet taken by the consumer."""
        return self._buffered

    @property
    def drained(self) -> bool:
        """The whole body arrived and the consumer has taken all of it."""
        return self._state == UPSTREAM_DONE and not self._body and self._exc is None

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
        if self._state == UPSTREAM_DONE:
            return b""
        return None

    async def next_chunk(self) -> bytes:
        """Like `take`, waiting until there is something to return."""
        while (chunk := self.take()) is None:
            await self._changed()
        return chunk

    async def wait_headers(self) -> None:
        # Once the headers are in, a later failure is raised by the body iteration instead.
        while self._state == UPSTREAM_HEADERS:
            await self._changed()

    async def wait_body(self) -> None:
        """Until a body byte arrived or the body ended; a failure before either is raised."""
        while self._state == UPSTREAM_BODY and not self._body:
            await self._changed()

    def attach(self, sink: BodySink) -> None:
        """Hand every body byte from now on to `sink`, starting with what is already here."""
        self._sink = sink
        if self._body or self._state == UPSTREAM_DONE or self._exc is not None:
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

    def park(self, now: float) -> None:
        """Return to UPSTREAM_IDLE after a reusable exchange, so EOF/data while idle are noticed."""
        self._state = UPSTREAM_IDLE
        self.idle_since = now
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def abort(self) -> None:
        """Close the socket at once, dropping unread data (the backend sees the client leave)."""
        if self._transport is not None and not self.closed:
            self._transport.abort()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()

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
        last = self._state == UPSTREAM_DONE
        if last:
            self._sink = None
        if not sink.relay(chunk, last) and not last:
            self._sink_full()

    def _collect(self) -> None:
        """Take the body pieces the parser appended since the last call, all of them in the
        state the exchange was in meanwhile: a body being received keeps them; any other
        (after a HEAD response, an unasked-for response) drops them, and the connection."""
        pieces = self._pieces
        if self._state != UPSTREAM_BODY:
            if pieces:
                self._keep_alive = False
                pieces.clear()
            return
        body = self._body
        size = 0
        for piece in pieces:
            if piece:  # b"" would mean the end of the body to the consumer
                body.append(piece)
                size += len(piece)
        pieces.clear()
        if size:
            buffered = self._buffered = self._buffered + size
            if buffered > HIGH_WATER and not self._paused and self._transport is not None:
                self._paused = True
                self._transport.pause_reading()
            self._wake()

    def _sink_full(self) -> None:
        """The sink asked to stop: reading pauses until it calls `resume_sink`."""
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def _resume(self) -> None:
        self._paused = False
        self._last_read = self._loop.time()
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()
        if self._state == UPSTREAM_BODY:
            self._timer.arm_by(self._limits.deadline(IN_BODY, self._last_read))

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

    def _fail(self, exc: UpstreamError) -> None:
        if self._exc is None and self._state in (UPSTREAM_HEADERS, UPSTREAM_BODY):
            self._exc = exc
        self.abort()
        self._wake()
        if self._sink is not None and self._exc is not None:
            self._deliver()

    def _complete(self, keep_alive: bool) -> None:
        self._state = UPSTREAM_DONE
        self._keep_alive = keep_alive
        self._wake()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it the first small write of a stream can wait for a delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
