"""What the router takes from each upstream chunk, however the body is relayed (router/proxy/
respond.py, router/proxy/splice.py): the first byte ends the request's prefill at the gate,
later ones time a stream's token gaps, and the tail keeps the usage report."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from router.ratelimit import USAGE_TAIL_BYTES

if TYPE_CHECKING:
    from router.proxy.forward import Exchange

_monotonic: Final = time.monotonic
# How far past the kept tail a response goes before the tail is trimmed: a trim walks the kept
# chunks, so the wider the slack, the fewer walks per stream, and the more bytes held per stream.
TAIL_SLACK: Final = 2 * USAGE_TAIL_BYTES


class UsageTail:
    """The last USAGE_TAIL_BYTES of a response, where its usage report is. Chunks are kept by
    reference, so keeping them copies nothing. Keeping one is a bare append to `chunks` (no
    call of ours per chunk); the relay trims once the response's byte count reaches `due`, so
    the kept chunks never span much more than USAGE_TAIL_BYTES and TAIL_SLACK, plus two chunks."""

    __slots__ = ("chunks", "due")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.due = USAGE_TAIL_BYTES  # the byte count of the response at which to trim

    def trim(self, total: int) -> None:
        """Drop the chunks older than the last USAGE_TAIL_BYTES; `total` is the response's byte
        count so far, the last kept chunk included."""
        # One C call, where dropping them one by one cost a call each.
        del self.chunks[: self._tail_start()]
        self.due = total + TAIL_SLACK

    def _tail_start(self) -> int:
        """The first of the chunks that the last USAGE_TAIL_BYTES are in."""
        chunks = self.chunks
        start = len(chunks)
        size = 0
        while start > 0 and size < USAGE_TAIL_BYTES:
            start -= 1
            size += len(chunks[start])
        return start

    @property
    def held(self) -> int:
        """Bytes kept now (what a stream costs in memory for its usage report)."""
        return sum(map(len, self.chunks))

    def value(self) -> bytes:
        """The response's last bytes: the chunks its last USAGE_TAIL_BYTES are in, joined (up to
        a chunk's length more); the chunks kept before them are dropped. Readers search only its
        last USAGE_TAIL_BYTES (router/ratelimit.py `usage_at`): cutting them out would copy the
        tail a second time, at the end of every response."""
        chunks = self.chunks
        start = self._tail_start()
        if start:
            del chunks[:start]
        return b"".join(chunks)


class ChunkLog:
    __slots__ = ("_gaps", "_gate", "_on_chunk", "_tail", "_ticket", "ex", "is_sse", "last", "timing")

    def __init__(self, ex: Exchange, is_sse: bool) -> None:
        self.ex = ex
        self.is_sse = is_sse
        self.last = 0.0
        # A stream whose first byte was seen: each chunk from now on times a token gap.
        self.timing = False
        self._gate = ex.lane.pool.gate
        self._ticket = ex.ticket
        self._gaps = ex.gaps
        self._tail = ex.usage_tail
        self._on_chunk = ex.on_chunk

    def record(self, chunk: bytes) -> float:
        """Record `chunk`'s arrival; return the time it was seen."""
        now = _monotonic()
        ex = self.ex
        if self.timing:
            self._gaps.observe(now - self.last)
        elif ex.first_byte_at is None:
            self.first_byte(now)
        self.last = now
        total = ex.bytes_out = ex.bytes_out + len(chunk)
        tail = self._tail
        if tail is not None:
            tail.chunks.append(chunk)
            if total >= tail.due:
                tail.trim(total)
        if self._on_chunk is not None:
            self._on_chunk(chunk)
        return now

    def first_byte(self, now: float) -> None:
        """The response's first body byte: its prefill is over."""
        self.ex.first_byte_at = now
        self.timing = self.is_sse
        self._gate.end_prefill(self._ticket)

    def backend_done(self) -> None:
        """The backend is done with this request: its slot is free now, not when the client is."""
        self._gate.end_attempt(self._ticket)
