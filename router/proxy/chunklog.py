"""What the router takes from each upstream chunk, however the body is relayed (router/proxy/
respond.py, router/proxy/splice.py): the first byte ends the request's prefill at the gate,
later ones time a stream's token gaps, and the tail keeps the usage report."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from router.keys.ratelimit import USAGE_TAIL_BYTES
from router.observe.slo import UNBOUNDED

if TYPE_CHECKING:
    from router.proxy.attempt import Attempt

_monotonic: Final = time.monotonic
# How far past the kept tail a response goes before the tail is trimmed: the wider the slack,
# the fewer trims per stream, and the more bytes held per stream.
TAIL_SLACK: Final = 2 * USAGE_TAIL_BYTES


class UsageTail:
    """The last USAGE_TAIL_BYTES of a response, where its usage report is. Chunks are kept by
    reference, so keeping them copies nothing: the chunk log appends them to `chunks` itself (no
    call of ours per chunk) and trims once the response's byte count reaches what the last trim
    returned, so the kept chunks never span much more than USAGE_TAIL_BYTES and TAIL_SLACK, plus
    two chunks. A trim walks only the chunks it drops, from the oldest: the bytes dropped before
    tell how many the kept ones hold, so the chunks that stay are not read again."""

    __slots__ = ("chunks", "dropped")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.dropped = 0  # the response's bytes no longer kept, all before the kept chunks

    def trim(self, total: int) -> int:
        """Drop the oldest chunks that the last USAGE_TAIL_BYTES are not in; `total` is the
        response's byte count so far, the last kept chunk included. Returns the byte count at
        which to trim next."""
        chunks = self.chunks
        held = total - self.dropped
        first = 0
        while held - len(chunks[first]) >= USAGE_TAIL_BYTES:
            held -= len(chunks[first])
            first += 1
        # One C call, where dropping them one by one cost a call each.
        del chunks[:first]
        self.dropped = total - held
        return total + TAIL_SLACK

    @property
    def held(self) -> int:
        """Bytes kept now (what a stream costs in memory for its usage report)."""
        return sum(map(len, self.chunks))

    def value(self, total: int) -> bytes:
        """The response's last bytes (`total`, its byte count): the chunks its last
        USAGE_TAIL_BYTES are in, joined (up to a chunk's length more). Readers search only its
        last USAGE_TAIL_BYTES (router/keys/ratelimit.py `usage_at`): cutting them out would copy the
        tail a second time, at the end of every response."""
        if total - self.dropped > USAGE_TAIL_BYTES:
            self.trim(total)
        return b"".join(self.chunks)


class ChunkLog:
    __slots__ = (
        "_due",
        "_gaps",
        "_gate",
        "_itl",
        "_kept",
        "_on_chunk",
        "_tail",
        "_ticket",
        "bytes_out",
        "ex",
        "gaps_late",
        "gaps_timed",
        "is_sse",
        "last",
        "timing",
    )

    def __init__(self, ex: Attempt, is_sse: bool) -> None:
        self.ex = ex
        self.is_sse = is_sse
        self.last = 0.0
        # A stream whose first byte was seen: each chunk from now on times a token gap.
        self.timing = False
        self._gate = ex.lane.pool.gate
        self._ticket = ex.ticket
        self._gaps = ex.gaps
        # Gaps timed, and those over the lane's ITL bound (read at a stream's first byte): its
        # SLO's verdict (router/observe/slo.py).
        self._itl = UNBOUNDED
        self.gaps_timed = 0
        self.gaps_late = 0
        tail = self._tail = ex.usage_tail
        # The tail's list, appended to here: a read touches the list and not the tail besides.
        self._kept = tail.chunks if tail is not None else None
        self._due = USAGE_TAIL_BYTES + TAIL_SLACK  # the byte count at which to trim the tail
        self._on_chunk = ex.on_chunk
        # The response's bytes so far, counted here and handed to the exchange when the relay
        # ends (router/proxy/respond.py): a read touches the log, not the exchange besides.
        self.bytes_out = ex.bytes_out

    def record(self, chunk: bytes) -> float:
        """Record `chunk`'s arrival; return the time it was seen."""
        now = _monotonic()
        if self.timing:
            gap = now - self.last
            self._gaps.observe(gap)
            self.gaps_timed += 1
            if gap > self._itl:
                self.gaps_late += 1
        elif self.ex.first_byte_at is None:
            self.first_byte(now)
        self.last = now
        total = self.bytes_out = self.bytes_out + len(chunk)
        kept = self._kept
        if kept is not None:
            kept.append(chunk)
            if total >= self._due:
                tail = self._tail
                assert tail is not None
                self._due = tail.trim(total)
        if self._on_chunk is not None:
            self._on_chunk(chunk)
        return now

    def first_byte(self, now: float) -> None:
        """The response's first body byte: its prefill is over."""
        ex = self.ex
        ex.first_byte_at = now
        if self.is_sse:
            self.timing = True
            slo = ex.lane.settings.slo
            if slo is not None:
                self._itl = slo.itl_s
        self._gate.end_prefill(self._ticket)

    def backend_done(self) -> None:
        """The backend is done with this request: its slot is free now, not when the client is."""
        self._gate.end_attempt(self._ticket)
