"""What the relay records of each upstream chunk: the first byte, the token gaps of a stream, the
byte count, and the tail that holds the usage report, for every shape of chunking."""

from __future__ import annotations

import random

import pytest

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.keys.ratelimit import USAGE_TAIL_BYTES
from router.lanes.poolgate import Ticket
from router.observe.leanmetrics import Buckets, HistogramValue
from router.observe.metrics import Metrics
from router.observe.record import RequestRecord
from router.proxy.attempt import Attempt
from router.proxy.chunklog import TAIL_SLACK, ChunkLog, UsageTail
from router.state.runtime import build_runtime
from tests.support.profiles import profile


def exchange(gaps: HistogramValue, tail: UsageTail | None) -> Attempt:
    rt = build_runtime(parse_profile(profile(["http://127.0.0.1:9100"])), Metrics())
    lane = rt.lanes[RequestClass.CHAT]
    ticket = Ticket(lane=lane, long=False, affinity=None)
    assert lane.pool.gate.try_take(ticket) is not None
    rec = RequestRecord(b"r", "/v1/chat/completions", 0.0, 0.0)
    return Attempt(
        lane=lane,
        target=b"/v1/chat/completions",
        body=b"{}",
        request_id=b"r",
        accept=None,
        ticket=ticket,
        started=0.0,
        response_headers=[],
        gaps=gaps,
        record=rec,
        usage_tail=tail,
    )


def histogram() -> HistogramValue:
    return HistogramValue(Buckets((0.1, float("inf")), ("0.1", "+Inf")))


def chunkings(seed: int) -> list[list[bytes]]:
    """Bodies cut into one-byte pieces, SSE-sized pieces, pieces larger than the tail, and a mix."""
    rng = random.Random(seed)
    body = bytes(rng.randrange(256) for _ in range(20_000))

    def cut(sizes: list[int]) -> list[bytes]:
        pieces, at = [], 0
        for size in sizes:
            pieces.append(body[at : at + size])
            at += size
        return [p for p in pieces if p]

    return [
        cut([1] * 3000),
        cut([150] * 140),
        cut([5000] * 4),
        cut([rng.choice((1, 7, 150, 900, 2047, 2048, 2049, 6000)) for _ in range(60)]),
        cut([USAGE_TAIL_BYTES - 1]),
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_tail_is_the_bodys_last_bytes_and_stays_small(seed: int) -> None:
    for pieces in chunkings(seed):
        tail = UsageTail()
        ex = exchange(histogram(), tail)
        log = ChunkLog(ex, is_sse=True)
        seen = b""
        for piece in pieces:
            log.record(piece)
            seen += piece
            assert tail.held <= USAGE_TAIL_BYTES + TAIL_SLACK + 2 * max(map(len, pieces))
            value = tail.value(log.bytes_out)
            # The body's last bytes, at least USAGE_TAIL_BYTES of them, at most a piece more.
            assert seen.endswith(value) and value[-USAGE_TAIL_BYTES:] == seen[-USAGE_TAIL_BYTES:]
            assert len(value) < USAGE_TAIL_BYTES + max(map(len, pieces))
        assert log.bytes_out == len(seen)


def test_a_streams_first_byte_ends_its_prefill_and_later_chunks_time_its_gaps() -> None:
    gaps = histogram()
    ex = exchange(gaps, None)
    log = ChunkLog(ex, is_sse=True)
    first = log.record(b"data: a\n\n")
    assert ex.first_byte_at == first and sum(gaps.counts) == 0
    for _ in range(5):
        log.record(b"data: b\n\n")
    assert sum(gaps.counts) == 5 and log.last >= first


def test_a_whole_body_has_a_first_byte_and_no_gaps() -> None:
    gaps = histogram()
    ex = exchange(gaps, None)
    log = ChunkLog(ex, is_sse=False)
    log.record(b'{"a":')
    log.record(b"1}")
    assert ex.first_byte_at is not None and sum(gaps.counts) == 0 and log.bytes_out == 7
