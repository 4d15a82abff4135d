"""One keep-alive HTTP/1.1 connection to an upstream: an asyncio Protocol driving httptools.

A connection carries one exchange at a time (no pipelining); the body goes to its one consumer
through `UpstreamBody` (router/proxy/upstream_body.py).

The time limits of `ResponseLimits` are deadlines watched by one lazily re-armed timer per
connection (`DeadlineTimer`): a body read only stamps its time, and the timer, when it fires,
re-arms itself at the deadline the stamps give by then. It is moved earlier only where a deadline
shortens — at the request, at a head that does not arrive whole in its first read, at the head's
end: at most a few times per exchange, never per chunk.

The response head is bounded as it arrives: its bytes and fields are counted in the head state
only, and past a limit the connection is aborted before more of it is buffered.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Final

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from router.errors import UpstreamClosed, UpstreamProtocolError, UpstreamTimeout
from router.proxy.chunks import one_chunk, whole_chunks
from router.proxy.http1 import body_is_delimited
from router.proxy.limits import BEFORE_HEAD, IN_BODY, IN_HEAD, DeadlineTimer, ResponseLimits
from router.proxy.upstream_body import (
    HIGH_WATER,
    LOW_WATER,
    UPSTREAM_BODY,
    UPSTREAM_HEADERS,
    UPSTREAM_IDLE,
    UpstreamBody,
)

__all__ = ["HIGH_WATER", "LOW_WATER", "UpstreamConnection"]

_CRLF: Final = b"\r\n"


class UpstreamConnection(UpstreamBody):
    __slots__ = (
        "_at_chunk_start",
        "_chunk_ends",
        "_chunk_starts",
        "_chunked",
        "_framing_bytes",
        "_head_bytes",
        "_head_request",
        "_head_since",
        "_interim",
        "_label",
        "_new_parser_needed",
        "_on_closed",
        "_open_chunks",
        "_parser",
        "got_bytes",
        "headers",
        "in_pool",
        "on_body",
        "on_chunk_complete",
        "on_chunk_header",
        "status",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limits: ResponseLimits,
        label: str,
        on_closed: Callable[[UpstreamConnection], None],
    ) -> None:
        super().__init__(loop, limits, DeadlineTimer(loop, self._on_timer))
        self._label = label  # names the backend in error messages, which clients may see
        self._on_closed = on_closed
        # The parser's body callback is a bare list append: no Python call per body piece. The
        # pieces are taken after each feed and at each message boundary (`_collect`).
        self.on_body = self._pieces.append
        # Chunk starts and ends, counted the same way: C calls, no Python call per chunk. Where
        # as many have ended as started, the parser is between chunks (`_parsed_to_chunk_start`).
        self._chunk_starts = itertools.count()
        self._chunk_ends = itertools.count()
        self.on_chunk_header = self._chunk_starts.__next__
        self.on_chunk_complete = self._chunk_ends.__next__
        self._open_chunks = 0
        self._parser = HttpResponseParser(self)
        self._new_parser_needed = False
        self.in_pool = False
        # Per exchange; `send` resets them.
        self._head_request = False
        self._interim = False
        self.headers: list[tuple[bytes, bytes]] = []  # the response's, as received
        self._head_since = 0.0  # the request's write, then the head's first byte
        self._head_bytes = 0
        self._framing_bytes = 0
        self.status = 0
        self.got_bytes = False  # a byte of the response arrived
        # The response's last transfer coding is chunked, and the parser is known to stand at
        # the start of a chunk: a read of whole chunks is taken without it (router/proxy/chunks.py).
        self._chunked = False
        self._at_chunk_start = False

    # -- used by the pool and the response -------------------------------------------------

    def send(self, head: bytes, body: bytes, *, head_request: bool) -> None:
        transport = self._transport
        assert transport is not None and self._state == UPSTREAM_IDLE
        if self._new_parser_needed:
            self._parser = HttpResponseParser(self)
            self._new_parser_needed = False
        self._head_request = head_request
        self._interim = False
        self._keep_alive = False
        self._exc = None
        self.headers = []
        self._head_bytes = 0
        self._framing_bytes = 0
        self.status = 0
        self.got_bytes = False
        self._chunked = self._at_chunk_start = False
        self._open_chunks = self._unfinished_chunks()
        self._state = UPSTREAM_HEADERS
        self._head_since = now = self._loop.time()
        self._timer.arm_by(now + self._limits.head_timeout)  # BEFORE_HEAD's deadline
        if not body:
            transport.write(head)
        elif len(body) <= 65536:
            transport.write(head + body)
        else:
            # Avoids copying a large body; uvloop turns this into a single writev.
            transport.writelines((head, body))

    # -- internals -------------------------------------------------------------------------

    def _on_timer(self) -> None:
        # While paused the consumer is the slow side, not the backend: no timeout then.
        state = self._state
        if self.closed or self._paused or (state != UPSTREAM_HEADERS and state != UPSTREAM_BODY):
            return
        if state == UPSTREAM_BODY:
            phase, since = IN_BODY, self._last_read
        else:
            phase, since = (IN_HEAD if self.got_bytes else BEFORE_HEAD), self._head_since
        deadline = self._limits.deadline(phase, since)
        if self._loop.time() < deadline:
            self._timer.arm_by(deadline)
            return
        self._fail(UpstreamTimeout(f"{self._label}: {self._limits.timed_out(phase)}"))

    # -- asyncio.Protocol ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state == UPSTREAM_BODY:
            # A stream's every read comes here: the parser is fed inline (not through `_feed`).
            before = self._buffered
            rest = data
            if self._at_chunk_start:
                # The whole chunks the read begins with, as the parser would have read them; a
                # paced stream's one chunk goes straight to the sink.
                start = one_chunk(data)
                if start > 0 and self._paced():
                    self._relay(data[start:-2], data)  # checked framing, passed on as it came
                    return
                chunks, taken = whole_chunks(data)
                self._pieces.extend(chunks)
                rest = data[taken:] if taken else data
            self._last_read = self._now()
            if rest:
                # The parser reads the rest, from the start of a chunk or wherever it stood.
                try:
                    self._parser.feed_data(rest)
                except (HttpParserError, HttpParserUpgrade) as exc:
                    self._collect()
                    self._parse_failed(exc)
                self._at_chunk_start = self._chunked and self._parsed_to_chunk_start(rest)
                pieces = self._pieces
                if len(pieces) == 1 and self._state == UPSTREAM_BODY and pieces[0] and self._paced():
                    self._relay(pieces.pop(), None)
                    return
            self._body_read(before, len(data))
        elif state == UPSTREAM_HEADERS:
            self._head_received(data)
        else:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self._keep_alive = False
            if state == UPSTREAM_IDLE:
                self.abort()

    def _paced(self) -> bool:
        """Whether a read that made one piece (not empty), the body going on, is a paced
        stream's: one for the sink, with nothing buffered before it."""
        # Nothing buffered: `_buffered` counts the bytes in `_body`, which holds no empty piece.
        return self._sink is not None and self._exc is None and self._buffered == 0

    def _relay(self, piece: bytes, framed: bytes | None) -> None:
        """A paced stream's read handed to the sink here, without passing through the buffer,
        its `relay` run inline; `framed`, the read itself when it was the piece's whole chunk."""
        sink = self._sink
        assert sink is not None
        self._framing_bytes = 0
        # The read's time as the chunk log took it: the monotonic clock the loop's time is read
        # from, a millisecond finer, so the read deadline is as before and the loop is not asked.
        self._last_read = now = sink.record(piece)
        if now >= sink.sample_at:
            if not sink.sample(piece, now):
                self._sink_full()
        elif sink.write(piece, False) if framed is None else sink.write_framed(framed, piece):
            sink.filled()
            self._sink_full()

    def _body_read(self, before: int, size: int) -> None:
        """A read inside the body, but not a paced stream's: `before` was buffered before it."""
        if self._pieces:
            self._collect()
        if self._buffered == before and self._state == UPSTREAM_BODY:
            self._framing_received(size)
            return
        self._framing_bytes = 0
        if self._sink is not None:
            self._deliver()

    def _head_received(self, data: bytes) -> None:
        """Feed bytes that begin inside the head; no more than `max_head_bytes` of a head reach
        the parser, which would otherwise keep growing each field it has not finished."""
        limits = self._limits
        first = not self.got_bytes
        if first:
            self.got_bytes = True
            self._head_since = self._loop.time()
        room = limits.max_head_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            try:  # `_feed`, inline: nearly every head and body arrive in this one read
                self._parser.feed_data(data)
            except (HttpParserError, HttpParserUpgrade) as exc:
                self._collect()
                self._parse_failed(exc)
            if self._pieces:
                self._collect()
            if self._chunked and self._state == UPSTREAM_BODY:
                self._at_chunk_start = self._parsed_to_chunk_start(data)
        else:
            view = memoryview(data)
            self._head_bytes = limits.max_head_bytes
            self._feed(view[:room])
            if self._state == UPSTREAM_HEADERS:
                msg = f"{self._label}: response head larger than {limits.max_head_bytes} bytes"
                self._fail(UpstreamProtocolError(msg))
                return
            self._feed(view[room:])  # the head ended in time; the rest is body
        if first and self._state == UPSTREAM_HEADERS and self._exc is None:
            # The head did not arrive whole with its first byte: the rest of it is timed now. A
            # head that did (nearly every one) leaves the timer alone: no re-arm per exchange.
            self._timer.arm_by(limits.deadline(IN_HEAD, self._head_since))

    def _unfinished_chunks(self) -> int:
        # Reading a count moves it on: both are read together, so their difference holds.
        return next(self._chunk_starts) - next(self._chunk_ends)

    def _parsed_to_chunk_start(self, data: bytes) -> bool:
        """Whether the parser, having read `data` into a chunked body, stands at a chunk's
        start: every chunk begun has ended, and the read did not stop inside a size line (one
        that ended with its CRLF would have begun a chunk)."""
        unfinished = self._unfinished_chunks()
        return self._exc is None and unfinished == self._open_chunks and data.endswith(_CRLF)

    def _framing_received(self, size: int) -> None:
        """Bytes after the head that carried no body: chunk sizes, extensions and trailers. The
        parser keeps a trailer field whole until it ends, so they are bounded like a head."""
        self._framing_bytes += size
        limit = self._limits.max_head_bytes
        if self._framing_bytes > limit:
            msg = f"{self._label}: over {limit} bytes of chunk framing or trailers"
            self._fail(UpstreamProtocolError(msg))

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as exc:
            self._collect()
            self._parse_failed(exc)
        self._collect()

    def _parse_failed(self, exc: HttpParserError | HttpParserUpgrade) -> None:
        if isinstance(exc, HttpParserUpgrade):
            self._fail(UpstreamProtocolError(f"{self._label}: the backend switched protocols"))
        else:
            # A limit hit inside a parser callback has already failed the exchange with its reason.
            self._fail(UpstreamProtocolError(f"{self._label}: malformed response: {exc}"))

    def eof_received(self) -> bool:
        if self._state == UPSTREAM_BODY and not self._head_request and not body_is_delimited(self.headers):
            self._complete(keep_alive=False)
            if self._sink is not None:
                self._deliver()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._timer.cancel()
        state = self._state
        if self._exc is None and state in (UPSTREAM_HEADERS, UPSTREAM_BODY):
            # The request went out: the backend may be running it, so this is no connect error
            # (those are retried) whether or not a response byte came back.
            if state == UPSTREAM_BODY:
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
        if self._state != UPSTREAM_HEADERS:  # trailers, which are dropped
            return
        headers = self.headers
        headers.append((name, value))
        if len(name) == 17 and name.lower() == b"transfer-encoding":
            # The last field decides, as the last coding does for the parser; anything but a
            # plain `chunked` leaves the body to the parser alone.
            self._chunked = value.lower() == b"chunked"
        if len(headers) > self._limits.max_headers:
            err = UpstreamProtocolError(
                f"{self._label}: more than {self._limits.max_headers} response header fields"
            )
            self._fail(err)
            raise err  # stops the parser

    def on_headers_complete(self) -> None:
        if self._pieces:  # the body of a response before this one, in the same read
            self._collect()
        if self._state != UPSTREAM_HEADERS:  # a second response nobody asked for
            self._keep_alive = False
            return
        status: int = self._parser.get_status_code()
        if status < 200:
            # An interim response (100 Continue, 103 Early Hints): the real one follows.
            self._interim = True
            self.headers = []
            return
        self.status = status
        self._state = UPSTREAM_BODY
        if self._head_request:
            # The parser cannot be told the response has no body; finish here and start the
            # next exchange with a fresh parser.
            self._new_parser_needed = True
            self._complete(self._parser.should_keep_alive())
        else:
            self._last_read = now = self._now()
            self._timer.arm_by(now + self._limits.read_timeout)  # IN_BODY's deadline
            self._wake()

    def on_message_complete(self) -> None:
        if self._pieces:
            self._collect()
        if self._interim:
            self._interim = False
            return
        if self._state == UPSTREAM_BODY:
            self._complete(self._parser.should_keep_alive())


class Lender(ABC):
    """Where a leased connection goes back when its response is done with it
    (router/proxy/upstream.py's pool). A base class, not a protocol: compiled, the call is a
    direct one."""

    __slots__ = ()

    @abstractmethod
    def give_back(self, conn: UpstreamConnection) -> None: ...
