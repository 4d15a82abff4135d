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

_CR: Final = 13
_LF: Final = 10
_MAX_SIZE_DIGITS: Final = 8  # 4 GiB less one: no read comes near it, and no overflow to check


def whole_chunks(data: bytes) -> tuple[list[bytes], int]:
    """The payloads of the whole chunks `data` begins with, none the last, and where the first
    byte they leave is (`len(data)` when they are all of it)."""
    end = len(data)
    pieces: list[bytes] = []
    at = 0
    while at < end:
        start, stop = _whole_chunk(data, at, end)
        if start < 0:
            break
        pieces.append(data[start:stop])
        at = stop + 2
    return pieces, at


def one_chunk(data: bytes) -> int:
    """Where the payload starts when `data` is one whole chunk, not the last (a paced stream's
    read); -1 when it is anything else. `whole_chunks` without the list, for the common case."""
    end = len(data)
    start, stop = _whole_chunk(data, 0, end)
    return start if start > 0 and stop + 2 == end else -1


def _whole_chunk(data: bytes, at: int, end: int) -> tuple[int, int]:
    """Where the payload of the whole chunk at `at` starts and stops (its CRLF follows), for a
    chunk that is not the last; (-1, -1) when there is none."""
    start, size = _size_line(data, at, end)
    stop = start + size
    if size <= 0 or stop + 2 > end or data[stop] != _CR or data[stop + 1] != _LF:
        return -1, -1
    return start, stop


def _size_line(data: bytes, at: int, end: int) -> tuple[int, int]:
    """Where a chunk's payload starts and its size, for the size line at `at`: a size of -1
    when the line is not 1 to 8 hex digits and CRLF."""
    size = 0
    i = at
    limit = min(at + _MAX_SIZE_DIGITS, end)
    while i < limit:
        digit = _hex_value(data[i])
        if digit < 0:
            break
        size = size * 16 + digit
        i += 1
    if i == at or i + 1 >= end or data[i] != _CR or data[i + 1] != _LF:
        return at, -1
    return i + 2, size


def _hex_value(byte: int) -> int:
    if 48 <= byte <= 57:  # 0-9
        return byte - 48
    if 97 <= byte <= 102:  # a-f
        return byte - 87
    if 65 <= byte <= 70:  # A-F
        return byte - 55
    return -1
