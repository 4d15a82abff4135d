"""What the router takes from each upstream chunk, however the body is relayed (router/proxy/
forward.py, router/proxy/splice.py): the first byte ends the request's prefill at the gate,
later ones time a stream's token gaps, and the tail keeps the usage report."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from router.ratelimit import USAGE_TAIL_BYTES

if TYPE_CHECKING:
    from router.proxy.forward import Exchange

_monotonic = time.monotonic


class UsageTail:
    """The last USAGE_TAIL_BYTES of a response, where its usage report is. Chunks are kept by
    reference and trimmed in whole chunks, so keeping them copies nothing per chunk."""

    __slots__ = ("_chunks", "_size")

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def add(self, chunk: bytes) -> None:
        chunks = self._chunks
        chunks.append(chunk)
        size = self._size + len(chunk)
        while size - len(chunks[0]) >= USAGE_TAIL_BYTES:
            size -= len(chunks.popleft())
        self._size = size

    def value(self) -> bytes:
        return b"".join(self._chunks)[-USAGE_TAIL_BYTES:]


class ChunkLog:
    __slots__ = ("_gate", "_observe_gap", "_on_chunk", "_tail", "_ticket", "ex", "is_sse", "last")

    def __init__(self, ex: Exchange, is_sse: bool) -> None:
        self.ex = ex
        self.is_sse = is_sse
        self.last = 0.0
        self._gate = ex.lane.pool.gate
        self._ticket = ex.ticket
        self._observe_gap = ex.observe_gap
        self._tail = ex.usage_tail
        self._on_chunk = ex.on_chunk

    def record(self, chunk: bytes) -> float:
        """Record `chunk`'s arrival; return the time it was seen."""
        now = _monotonic()
        ex = self.ex
        if ex.first_byte_at is None:
            ex.first_byte_at = now
            self._gate.end_prefill(self._ticket)
        elif self.is_sse:
            self._observe_gap(now - self.last)
        self.last = now
        ex.bytes_out += len(chunk)
        if self._tail is not None:
            self._tail.add(chunk)
        if self._on_chunk is not None:
            self._on_chunk(chunk)
        return now

    def backend_done(self) -> None:
        """The backend is done with this request: its slot is free now, not when the client is."""
        self._gate.end_attempt(self._ticket)
