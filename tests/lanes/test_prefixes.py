"""Repeated-prefix memory: sightings within the window, and a hard bound on memory."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.lanes.prefixes import PrefixHistory


def history(seen: int = 2, window_s: float = 600.0, max_entries: int = 1024) -> PrefixHistory:
    return PrefixHistory(seen=seen, window_s=window_s, max_entries=max_entries)


def test_third_sighting_within_the_window_reports_two_earlier() -> None:
    h = history(seen=2)

    assert h.observe(b"doc", 0.0) == 0
    assert h.observe(b"doc", 10.0) == 1
    assert h.observe(b"doc", 20.0) >= 2


def test_count_is_capped_at_seen() -> None:
    h = history(seen=3)
    counts = [h.observe(b"doc", float(t)) for t in range(10)]

    assert counts == [0, 1, 2, 3, 3, 3, 3, 3, 3, 3]


def test_fingerprints_are_counted_separately() -> None:
    h = history()
    h.observe(b"a", 0.0)
    h.observe(b"a", 1.0)

    assert h.observe(b"b", 2.0) == 0
    assert h.observe(b"a", 3.0) == 2


def test_sightings_outside_the_window_do_not_count() -> None:
    h = history(seen=2, window_s=100.0)
    h.observe(b"doc", 0.0)
    h.observe(b"doc", 10.0)

    assert h.observe(b"doc", 105.0) == 1  # the sighting at 0 has left the window, 10 has not
    assert h.observe(b"doc", 500.0) == 0


def test_a_sighting_exactly_at_the_window_edge_still_counts() -> None:
    h = history(seen=2, window_s=100.0)
    h.observe(b"doc", 0.0)

    assert h.observe(b"doc", 100.0) == 1


def test_memory_is_bounded_under_many_fingerprints() -> None:
    h = history(max_entries=64)
    for i in range(10_000):
        h.observe(i.to_bytes(8, "big"), float(i))
        assert len(h) <= 64

    assert len(h) == 64


def test_least_recently_seen_fingerprint_is_dropped_first() -> None:
    h = history(max_entries=16)
    for i in range(16):
        h.observe(bytes([i]), float(i))
    h.observe(bytes([0]), 20.0)  # refresh 0: now 1 is the oldest

    h.observe(b"new", 21.0)

    assert h.observe(bytes([0]), 22.0) == 2  # kept
    assert h.observe(bytes([1]), 23.0) == 0  # forgotten


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(0, 40), st.floats(0, 50, allow_nan=False)), max_size=200),
    seen=st.integers(1, 4),
    window=st.floats(1, 30),
)
def test_matches_a_brute_force_count_while_nothing_is_evicted(
    events: list[tuple[int, float]], seen: int, window: float
) -> None:
    h = PrefixHistory(seen=seen, window_s=window, max_entries=64)
    past: dict[int, list[float]] = {}
    now = 0.0
    for fp, step in events:
        now += step
        earlier = [t for t in past.get(fp, []) if t >= now - window]
        assert h.observe(fp.to_bytes(1, "big"), now) == min(len(earlier), seen)
        past.setdefault(fp, []).append(now)
