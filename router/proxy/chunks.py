"""Whole chunks of a chunked response body, read without the HTTP parser.

A paced stream (vLLM's, one token per event) arrives one chunk per read: a size line, the
event, CRLF. When the parser stands at the start of a chunk, the whole chunks a read begins with
are taken here and the parser never sees them, which leaves it where it was: at the start of the
next chunk. What follows them (a chunk cut by the read, the last chunk, an extension, a size of
more than 8 hex digits, a missing CRLF) is the parser's, from that start, so what this takes is
exactly what the parser would have made of it and no framing error can pass it
(router/proxy/upstream_connection.py; tests/proxy/test_chunks.py compares the two on generated
reads and read splits)."""

from __future__ import annotations

from typing import Final

from mypy_extensions import i64

_CR: Final = 13
_LF: Final = 10
_MAX_SIZE_DIGITS: Final = 8  # 4 GiB less one: no read comes near it, and no overflow to check


def whole_chunks(data: bytes) -> tuple[list[bytes], int]:
    """The payloads of the whole chunks `data` begins with, none the last, and where the first
    byte they leave is (`len(data)` when they are all of it)."""
    end: i64 = len(data)
    pieces: list[bytes] = []
    at: i64 = 0
    while at < end:
        start, size = _size_line(data, at, end)
        stop = start + size
        if size <= 0 or stop + 2 > end or data[stop] != _CR or data[stop + 1] != _LF:
            break
        pieces.append(data[start:stop])
        at = stop + 2
    return pieces, at


def one_chunk(data: bytes) -> int:
    """Where the payload starts when `data` is one whole chunk, not the last (a paced stream's
    read); -1 when it is anything else. `whole_chunks` without the list, for the common case."""
    end: i64 = len(data)
    start, size = _size_line(data, 0, end)
    if size <= 0 or start + size + 2 != end or data[end - 2] != _CR or data[end - 1] != _LF:
        return -1
    return start


def _size_line(data: bytes, at: i64, end: i64) -> tuple[i64, i64]:
    """Where a chunk's payload starts and its size, for the size line at `at`: a size of -1
    when the line is not 1 to 8 hex digits and CRLF."""
    # Fixed-width integers and the digit ranges inline: compiled, a read's size line is parsed
    # without a boxed integer or a call per digit.
    size: i64 = 0
    i: i64 = at
    limit: i64 = min(at + _MAX_SIZE_DIGITS, end)
    while i < limit:
        byte: i64 = data[i]
        if 48 <= byte <= 57:  # 0-9
            size = size * 16 + byte - 48
        elif 97 <= byte <= 102:  # a-f
            size = size * 16 + byte - 87
        elif 65 <= byte <= 70:  # A-F
            size = size * 16 + byte - 55
        else:
            break
        i += 1
    if i == at or i + 1 >= end or data[i] != _CR or data[i + 1] != _LF:
        return at, -1
    return i + 2, size
