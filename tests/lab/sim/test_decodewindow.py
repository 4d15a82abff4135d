from __future__ import annotations

import pytest

from router.lab.sim.decodewindow import common_stretches, decode_point, max_overlap
from router.lab.sim.timedstream import TimedStream


def engine_trace(starts: list[float], tokens: int, step: float = 0.005, per_seq: float = 0.001,
                 max_running: int = 64) -> list[TimedStream]:  # fmt: skip
    """Token arrivals from an engine whose step takes `step + per_seq × running`: each stream
    joins at the first step after it arrives (if a slot is free) and makes one token a step."""
    times: list[list[float]] = [[] for _ in starts]
    now = 0.0
    while any(len(t) < tokens for t in times):
        running = [i for i, t in enumerate(times) if t and len(t) < tokens]
        for i, t in enumerate(times):
            if not t and starts[i] <= now and len(running) < max_running:
                running.append(i)
        if not running:
            now = min(starts[i] for i, t in enumerate(times) if not t)
            continue
        now += step + per_seq * len(running)
        for i in running:
            times[i].append(now)
    return [TimedStream(start, t, 32) for start, t in zip(starts, times, strict=True)]


def test_max_overlap_counts_streams_producing_at_once() -> None:
    def s(first: float, last: float) -> TimedStream:
        return TimedStream(0.0, [first, last], 8)

    assert max_overlap([s(0, 10), s(1, 9), s(2, 8)]) == 3
    # The second wave starts when the first ends: a server running two at a time.
    assert max_overlap([s(0, 5), s(0, 5), s(5, 9), s(5, 9)]) == 2


def test_staggered_admission_is_read_where_every_stream_decodes() -> None:
    streams = engine_trace([i * 0.03 for i in range(16)], tokens=64)
    point = decode_point(streams, skip=4)
    assert point is not None
    assert point.ran == 16
    assert point.step == pytest.approx(0.005 + 16 * 0.001)
    # Read over each stream's life instead, the step belongs to a smaller batch than 16.
    lifetime = [(s.end - s.token_times[4]) / (len(s.token_times) - 5) for s in streams]
    assert max(lifetime) < 0.95 * point.step


def test_context_counts_the_output_made_before_the_stretch() -> None:
    streams = engine_trace([i * 0.01 for i in range(4)], tokens=40)
    stretches = common_stretches(streams)
    assert stretches is not None
    assert stretches[0].made_before > stretches[-1].made_before == 0
    point = decode_point(streams, skip=4)
    assert point is not None
    expected = sum(32 + x.made_before + x.gaps / 2 for x in stretches) / 4
    assert point.context == pytest.approx(expected)


def test_a_server_running_fewer_than_sent_is_read_over_lifetimes_at_its_limit() -> None:
    streams = engine_trace([0.0] * 4, tokens=30, max_running=2)
    assert common_stretches(streams) is None
    point = decode_point(streams, skip=4)
    assert point is not None
    assert point.ran == 2
    assert point.step == pytest.approx(0.005 + 2 * 0.001)


def test_too_short_a_common_stretch_falls_back_to_lifetimes() -> None:
    streams = engine_trace([i * 0.05 for i in range(4)], tokens=12)
    assert common_stretches(streams) is None
    assert decode_point(streams, skip=2) is not None


def test_a_probe_spoiled_by_pauses_gives_nothing() -> None:
    streams = engine_trace([0.0] * 4, tokens=20)
    assert decode_point(streams, skip=4, clean=lambda start, end: False) is None
    assert decode_point(streams, skip=4, clean=lambda start, end: True) is not None
