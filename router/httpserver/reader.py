"""The reading half of a connection: bytes into the request parser within the head limits,
parser events into requests.

Bytes are fed to the parser within a budget while a head is incomplete, so a head that never
ends is refused after `max_head_bytes` (plus at most the rest of one socket read) instead of
growing in the parser; the header count is checked as each header completes. Both happen before
the app is called. A chunked body's framing (each size line, and the trailer after the last
chunk) is fed within the same budget, counted afresh at every chunk, so only body data is fed
unbounded; trailer fields are read and dropped, never part of the request's headers (RFC 9110
§6.5.1), and the trailer has the head's deadline. A transfer coding other than `chunked` is
refused (501) before the app is called. `Connection` (router/httpserver/connection.py) decides
what a parsed request leads to."""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NewType

from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser

from router.httpserver.deadlines import INF
from router.httpserver.link import ClientLink
from router.httpserver.scope import http_scope, scope_base, split_target
from router.httpserver.wire import client_error

if TYPE_CHECKING:
    from router.httpserver.config import ServerConfig
    from router.httpserver.exchange import Exchange
    from router.httpserver.wire import DateHeader

# What the read side expects next: a type of its own, so mypy refuses another vocabulary's
# values here (a NewType costs nothing compiled: it is its base type there).
ReadPhase = NewType("ReadPhase", int)
READ_WAIT: Final = ReadPhase(0)  # the next request: nothing of it has arrived
READ_HEAD: Final = ReadPhase(1)  # the rest of a request head
READ_BODY: Final = ReadPhase(2)  # the rest of a request body
READ_ENDING: Final = ReadPhase(3)  # nothing: the connection is closing

# Why reading is paused (bits).
QUEUED: Final = 1  # a pipelined request waits behind the one in progress
BODY_HELD: Final = 2  # the app has not taken the body bytes held for it
STOPPED: Final = 4  # the connection is ending


_HTTP_11: Final = b" HTTP/1.1"
_HTTP_10: Final = b" HTTP/1.0"
_LF: Final = 0x0A

# The methods' names, decoded once.
_METHODS: Final = MappingProxyType(
    {m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE")}
)


class _Refused(Exception):
    """Stops the parser from inside a callback; the answer is in `RequestReader._refusal`."""


class RequestReader(ClientLink):
    __slots__ = (
        "_bare_since",
        "_coded",
        "_config",
        "_counted",
        "_draining",
        "_expect",
        "_head_bytes",
        "_headers",
        "_last_read",
        "_latest",
        "_line_version",
        "_parser",
        "_parsing",
        "_paused",
        "_phase",
        "_refusal",
        "_resuming",
        "_scheme",
        "_scope_base",
        "_served",
        "_split",
        "_split_target",
        "_target",
        "_trailer_begun",
        "endpoints",
    )

    def __init__(
        self, config: ServerConfig, date: DateHeader, scheme: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(loop)
        self._config = config
        self._scheme = scheme
        self.date = date
        self.transport = None
        self.endpoints: tuple[tuple[str, int] | None, tuple[str, int] | None] = (None, None)
        self._parser = HttpRequestParser(self)
        self._phase = READ_WAIT
        self._paused = 0
        self._last_read = 0.0
        self._head_bytes = 0
        # Whether the bytes being fed count against `max_head_bytes`: all but body data.
        self._counted = True
        # The read time of the size line a chunk began with while none of its data has come:
        # the last chunk's trailer is being read, or a chunk's data is yet to arrive.
        self._bare_since = INF
        # A byte has come since that size line and was no data: it was the last chunk's, and
        # its trailer has begun. Until then the wait may be for data, which has the body's time.
        self._trailer_begun = False
        self._coded = False  # the head names a transfer coding
        self._headers: list[tuple[bytes, bytes]] = []
        self._target = b""
        self._scope_base: dict[str, Any] | None = None  # once the endpoints are known
        # Requests on one connection mostly repeat their target: its split is kept for the next.
        self._split_target = b""
        self._split: tuple[str, bytes, bytes] = ("", b"", b"")
        self._expect = False
        # The version the request line named, read from the bytes (None: the parser is asked).
        self._line_version: str | None = None
        self._resuming = False
        self._refusal: bytes | None = None
        self._served = 0  # request heads read
        self._parsing: Exchange | None = None  # the request whose body is arriving
        self._latest: Exchange | None = None
        # The request was answered before its body arrived: the rest is read only to be dropped.
        self._draining = False
        self.closing = False  # end the connection after the response in progress

    # -- what the connection does with what was read ---------------------------------------------

    def _accept(self, scope: dict[str, Any], keep_alive: bool, expect_continue: bool) -> Exchange:
        """A request head is complete: its exchange, started or queued."""
        raise NotImplementedError

    def _head_started(self) -> None:
        raise NotImplementedError

    def _drained(self) -> None:
        """The body being dropped (`_draining`) has ended."""
        raise NotImplementedError

    def _refuse(self, answer: bytes | None) -> None:
        """Answer without calling the app (None: just end) and close."""
        raise NotImplementedError

    # -- feeding the parser -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        if self._phase != READ_ENDING:
            self._feed(data)
            # A body still to come may have a deadline before the one armed.
            if self._timer is None or self._phase == READ_BODY:
                self.rearm()

    def _feed(self, data: bytes) -> None:
        if self._phase == READ_WAIT:
            # A read that begins a request begins with its request line.
            self._line_version = line_version(data)
        view: bytes | memoryview = data
        limit = self._config.max_head_bytes
        parser = self._parser
        while view:
            piece = view
            if self._counted:
                room = limit - self._head_bytes
                if len(view) > room:
                    view = memoryview(view)
                    piece = view[:room]
                self._head_bytes += len(piece)
            try:
                parser.feed_data(piece)
                if self._counted and self._bare_since != INF and not self._trailer_begun:
                    # A size line then bytes that made no data: a trailer. A read that ended
                    # with a line end may have ended with the size line itself (a field
                    # ending there is told by the parser only with the next byte).
                    self._trailer_begun = piece[-1] != _LF
            except HttpParserUpgrade as up:
                view = view[up.args[0] :]
                if not self._upgraded():
                    return
                parser = self._parser
                continue
            except HttpParserError as exc:
                if self._phase != READ_ENDING:
                    self._refuse(self._refusal or self._bad_request(exc))
                return
            if self._phase == READ_ENDING:
                return
            if self._counted and self._head_bytes >= limit:
                self._refuse(self._too_large())
                return
            view = view[len(piece) :]

    def _too_large(self) -> bytes:
        if self._phase != READ_BODY:
            what = "the request head is too large"
        elif self._bare():  # bytes after a size line that made no data: the trailer's
            what = "the request trailer is too large"
        else:
            return client_error(self.date, 400, "a chunk size line is too long", "invalid_request")
        return client_error(self.date, 431, what, "request_header_fields_too_large")

    def _bad_request(self, exc: Exception) -> bytes:
        return client_error(self.date, 400, f"malformed request: {exc}", "invalid_request")

    # -- parser callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._resuming:
            return
        if self._phase == READ_ENDING:
            raise _Refused  # closing: what follows is not read
        self._phase = READ_HEAD
        self._target = b""
        self._headers = []
        self._expect = False
        self._coded = False
        self._head_started()

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase != READ_HEAD:
            # A trailer field (or the framing `_upgraded` primes a parser with): dropped.
            if self._bare_since != INF:
                self._trailer_begun = True
            return
        headers = self._headers
        if len(headers) >= self._config.max_headers:
            self._stop(431, "too many request headers", "too_many_headers")
        name = name.lower()
        if name == b"expect":
            if value.lower() == b"100-continue":
                self._expect = True
        elif name == b"transfer-encoding":
            self._coded = True
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._resuming:
            self._resuming = False
            return
        parser = self._parser
        version = self._line_version
        if version is None:
            version = parser.get_http_version()
        else:
            self._line_version = None  # a request pipelined behind this one asks the parser
        if version != "1.1" and version != "1.0":
            self._stop(505, f"HTTP/{version} is not supported", "http_version_not_supported")
        headers = self._headers
        if self._coded:
            self._check_codings(version, headers)
        self._phase = READ_BODY
        self._head_bytes = 0
        # A chunked body begins with framing; any other is data from its first byte.
        self._counted = self._coded
        self._served += 1
        raw_method = parser.get_method()
        try:
            method = _METHODS[raw_method]
        except KeyError:
            method = raw_method.decode("ascii")
        target = self._target
        if target == self._split_target:
            split = self._split
        else:
            split = self._split = split_target(target)
            self._split_target = target
        base = self._scope_base
        if base is None:
            base = self._scope_base = scope_base(self._scheme, self.endpoints)
        scope = http_scope(base, method, split, version, headers)
        keep_alive = parser.should_keep_alive() and not self.closing and method != "CONNECT"
        self._parsing = self._latest = self._accept(scope, keep_alive, self._expect and version == "1.1")

    def on_chunk_header(self) -> None:
        # What follows the size line is the chunk's data, or the trailer if it was the last.
        self._head_bytes = 0
        self._bare_since = self._last_read
        self._trailer_begun = False

    def on_chunk_complete(self) -> None:
        # The next chunk's size line (or nothing: the message is complete) follows.
        self._counted = True
        self._head_bytes = 0
        self._bare_since = INF

    def on_body(self, body: bytes) -> None:
        self._counted = False
        ex = self._parsing
        if ex is not None and ex.feed(body, self._config.body_buffer_bytes):
            self._pause(BODY_HELD)

    def on_message_complete(self) -> None:
        ex = self._parsing
        if ex is None:
            return
        if self._parser.should_upgrade() and body_framing(ex.scope["headers"]):
            return  # the parser skipped this body: `_upgraded` has it read
        self._parsing = None
        self._phase = READ_WAIT
        self._counted = True  # the next request's head
        ex.end_body()
        if self._draining:
            self._drained()

    def _check_codings(self, version: str, headers: list[tuple[bytes, bytes]]) -> None:
        """A request may frame its body in chunks and nothing else: the server decodes no other
        transfer coding, and one it passed on undecoded would be read as the body itself."""
        if version == "1.0":
            self._stop(400, "transfer-encoding is not allowed in HTTP/1.0", "invalid_request")
        codings = transfer_codings(headers)
        unknown = [coding for coding in codings if coding != b"chunked"]
        if unknown:
            named = b", ".join(unknown).decode("latin-1")
            self._stop(501, f"transfer coding {named!r} is not implemented", "unsupported_transfer_coding")
        if len(codings) != 1:
            self._stop(400, "transfer-encoding must name chunked exactly once", "invalid_request")

    def _stop(self, status: int, message: str, code: str) -> None:
        self._refusal = client_error(self.date, status, message, code)
        raise _Refused

    def _upgraded(self) -> bool:
        """The parser stopped after a request asking for another protocol. It is answered as
        plain HTTP: a CONNECT ends the connection; any other goes on, its body (which the parser
        would skip) read through a fresh parser primed with the same framing."""
        ex = self._latest
        if ex is None or ex.scope["method"] == "CONNECT":
            self._refuse(None)
            return False
        framing = body_framing(ex.scope["headers"])
        if framing:
            self._parser = HttpRequestParser(self)
            self._resuming = True
            self._parser.feed_data(b"POST / HTTP/1.1\r\n%b\r\n\r\n" % framing)
        return True

    # -- pausing ----------------------------------------------------------------------------------

    def _pause(self, reason: int) -> None:
        if not self._paused:
            self.transport.pause_reading()
        self._paused |= reason

    def _bare(self) -> bool:
        """Whether a chunk's size line was the last one read and none of its data has come."""
        return self._counted and self._bare_since != INF

    def in_trailer(self) -> bool:
        """Whether the trailer of the last chunk is being read: bytes that made no data came
        after its size line. A size line with nothing after it yet may be a chunk's whose data
        is still to come: the wait is the body's until a byte tells."""
        return self._trailer_begun and self._bare()

    def _resume(self, reason: int) -> None:
        if self._paused & reason:
            self._paused &= ~reason
            if not self._paused:
                self.transport.resume_reading()
                self._last_read = self.loop.time()
                if self._bare():  # its clock ran while the server did not read
                    self._bare_since = self._last_read
                self.rearm()


def line_version(data: bytes) -> str | None:
    """The version named by the request line `data` begins with, when that line ends in `data`
    and names HTTP/1.1 or 1.0 (None otherwise: the parser says). The parser will have read the
    line whole before the version is used, so its last nine bytes are its version."""
    end = data.find(b"\r\n")
    if end < 9:
        return None
    # The parser's own answer costs a call that formats the version anew for every request.
    named = data[end - 9 : end]
    if named == _HTTP_11:
        return "1.1"
    if named == _HTTP_10:
        return "1.0"
    return None


def transfer_codings(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The transfer codings a head names, in order and lowered, over all its transfer-encoding
    fields; empty list elements are skipped (RFC 9110 §5.6.1)."""
    codings = []
    for name, value in headers:
        if name == b"transfer-encoding":
            for element in value.split(b","):
                coding = element.strip(b" \t").lower()
                if coding:
                    codings.append(coding)
    return codings


def body_framing(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The header line that delimits a request's body; b"" for a request without one."""
    for name, value in headers:
        if name == b"transfer-encoding":
            return b"transfer-encoding: " + value
        if name == b"content-length" and value.strip(b" \t") not in (b"0", b""):
            return b"content-length: " + value.strip(b" \t")
    return b""
