"""Bytes the server writes on its own: status lines, the date header, chunk framing, and the
complete answers it gives without calling the app (oversized or late heads, bad requests, an app
that failed before its response started)."""

from __future__ import annotations

import fcntl
import sys
import termios
import time
from email.utils import formatdate
from http import HTTPStatus
from types import MappingProxyType
from typing import Final

import orjson

CRLF: Final = b"\r\n"
LAST_CHUNK: Final = b"0\r\n\r\n"
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"

# TIOCOUTQ == SIOCOUTQ on Linux: a TCP socket's unacknowledged send queue. Absent elsewhere (-1).
_OUTQ: Final[int] = getattr(termios, "TIOCOUTQ", -1)
_NATIVE_ORDER: Final = sys.byteorder  # the ioctl answers an int as the machine stores it
# Whether `send_queue` can tell anything on this platform.
TELLS_SEND_QUEUE: Final[bool] = _OUTQ >= 0

# Above this a body is handed to the transport as its own buffer instead of being copied into
# one joined write with its framing.
JOIN_LIMIT: Final = 16 * 1024

STATUS_LINES: Final = MappingProxyType(
    {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("ascii")) for s in HTTPStatus}
)


def status_line(status: int) -> bytes:
    # A subscript, not `get`: a mapping proxy's `get` is a method call on the dict behind it.
    try:
        return STATUS_LINES[status]
    except KeyError:
        pass
    if not 100 <= status <= 999:
        raise RuntimeError(f"invalid HTTP status {status!r}")
    return b"HTTP/1.1 %d \r\n" % status


def send_queue(fd: int) -> int:
    """Bytes written to a socket that its peer has not acknowledged, as the kernel holds them; 0
    for a descriptor already closed, or where the platform does not tell (TELLS_SEND_QUEUE)."""
    if fd < 0 or _OUTQ < 0:
        return 0
    try:
        return int.from_bytes(fcntl.ioctl(fd, _OUTQ, b"\0\0\0\0"), _NATIVE_ORDER)
    except OSError:  # closed meanwhile, or the number reused by something that is not a socket
        return 0


class DateHeader:
    """The `date` header line, formatted at most once a second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._line = b"date: %s\r\n" % formatdate(second, usegmt=True).encode("ascii")
        return self._line


def envelope(message: str, type_: str, code: str) -> bytes:
    """An OpenAI-style error body, the shape every answer of the router has."""
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code}})


def error_answer(date: DateHeader, status: int, message: str, code: str, type_: str) -> bytes:
    """A complete JSON error response that ends the connection."""
    body = envelope(message, type_, code)
    return b"".join(
        (
            status_line(status),
            date.line(),
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body),
            body,
        )
    )


def client_error(date: DateHeader, status: int, message: str, code: str) -> bytes:
    return error_answer(date, status, message, code, "invalid_request_error")


def internal_error(date: DateHeader) -> bytes:
    return error_answer(date, 500, "internal router error", "internal_error", "server_error")
