"""How a response goes on the wire: its head bytes and how its body is delimited, decided once
when the app starts the response."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from router.httpserver.wire import CRLF, STATUS_LINES, DateHeader, status_line

# Body delimitation.
LENGTH: Final = 0  # the app's content-length
CHUNKED: Final = 1  # HTTP/1.1 without a length
UNTIL_CLOSE: Final = 2  # HTTP/1.0 without a length: the end of the body is the end of the connection
NO_BODY: Final = 3  # HEAD, 204, 304: body bytes the app sends are dropped

_CHUNKED_LINE: Final = b"transfer-encoding: chunked\r\n"
_CLOSE_LINE: Final = b"connection: close\r\n"
_KEEP_ALIVE_LINE: Final = b"connection: keep-alive\r\n"
_EVENT_STREAM: Final = b"text/event-stream"
# The app's headers the server looks at (content-length, content-type, transfer-encoding,
# connection, date; all others pass as they are) begin with c, d or t. A name that does not, in
# either case, is passed on without being lowered first: most of an answer's headers are x-….
_LOWER_C: Final = 99
_LOWER_D: Final = 100
_LOWER_T: Final = 116
_CR: Final = 13
_LF: Final = 10


# (head, framing, content length or -1, keep-alive, is an event stream): a plain tuple, as one is
# made for every response.
Plan = tuple[bytes, int, int, bool, bool]


def plan_response(
    status: int,
    headers: Iterable[tuple[bytes, bytes]],
    head_request: bool,
    http11: bool,
    keep_alive: bool,
    date: DateHeader,
) -> Plan:
    """The head to write and the framing of the body. The server owns the framing and connection
    headers: an app's `transfer-encoding` is replaced by the server's own choice, and its
    `connection: close` is honoured."""
    if status < 200:
        raise RuntimeError(f"status {status} cannot start a response (no protocol switch here)")
    # The known lines looked up here, not in a call: every response takes one.
    line = STATUS_LINES[status] if status in STATUS_LINES else status_line(status)
    parts = [line]
    length = -1
    event_stream = False
    dated = False
    for name, value in headers:
        first = name[0] | 32 if name else 0
        if first in (_LOWER_C, _LOWER_D, _LOWER_T):
            # Compared one by one: a lowered name is a new object, whose hash a set lookup
            # would compute first.
            low = name.lower()
            if low == b"content-length":
                if not value.isdigit():
                    raise RuntimeError(f"invalid content-length {value!r}")
                length = int(value)
            elif low == b"content-type":
                event_stream = value.startswith(_EVENT_STREAM)
            elif low == b"transfer-encoding":
                continue
            elif low == b"connection":
                keep_alive = keep_alive and value.lower().find(b"close") < 0
                continue
            elif low == b"date":
                dated = True
        # Four appends: a tuple of the four added at once was built and freed for each header.
        parts.append(name)
        parts.append(b": ")
        parts.append(value)
        parts.append(CRLF)
    written = (len(parts) - 1) >> 2  # app headers kept: four parts each, one line ending
    if not dated:
        parts.append(date.line())
    if head_request or status in (204, 304):
        framing = NO_BODY
    elif length >= 0:
        framing = LENGTH
    elif http11:
        framing = CHUNKED
        parts.append(_CHUNKED_LINE)
    else:
        framing = UNTIL_CLOSE
        keep_alive = False
    if not keep_alive:
        parts.append(_CLOSE_LINE)
    elif not http11:
        parts.append(_KEEP_ALIVE_LINE)
    parts.append(CRLF)
    # A CR or LF in an app's header name or value would let it inject headers or a second
    # response. The names and values are every other part after the status line; joined, two
    # byte searches check them (by the byte's value: a one-byte string is first tried as a number
    # and fails, which costs more than the search), where a pass over the whole head cost more.
    app_fields = b"".join(parts[1 : 1 + 4 * written : 2])
    if _CR in app_fields or _LF in app_fields:
        raise RuntimeError("response header names and values must not contain CR or LF")
    return b"".join(parts), framing, length if framing == LENGTH else -1, keep_alive, event_stream


def chunk(data: bytes, last: bool) -> bytes:
    """`data` as one chunk, and the terminator after it when `last`."""
    if last:
        return b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)
    return b"%x\r\n%b\r\n" % (len(data), data)
