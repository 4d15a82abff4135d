"""The lock-free families expose exactly what prometheus_client's own classes expose for the
same observations: names, labels, bucket bounds, values and sample order."""

from __future__ import annotations

import bisect
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from router.observe.leanmetrics import Buckets, HistogramValue, counter, gauge, histogram
from router.observe.metrics import ITL_BUCKETS, LATENCY_BUCKETS

BUCKETS = (0.001, 0.005, 0.02, 1.0, 8.0)
AMOUNTS = (0.0, 0.0005, 0.001, 0.003, 0.005, 0.5, 1.0, 7.9, 8.0, 90.0)


def _stable(registry: CollectorRegistry) -> str:
    # Creation times differ between the two registries; everything else must not.
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", generate_latest(registry).decode())


def _fill(requests: Any, in_flight: Any, latency: Any) -> None:
    for status in ("200", "429", "200"):
        requests.labels("chat", status).inc()
    requests.labels("batch", "200").inc(2.5)
    for amount in AMOUNTS:
        latency.labels("chat").observe(amount)
    latency.labels("rag").observe(0.01)
    lane = in_flight.labels("chat")
    lane.inc()
    lane.inc()
    lane.dec()
    in_flight.labels("rag").set(4)


@pytest.mark.parametrize("created", ["", "true"])
def test_lean_families_expose_what_prometheus_client_exposes(
    created: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", created or "false")
    theirs = CollectorRegistry()
    _fill(
        Counter("x_requests", "Requests.", ["lane", "status"], registry=theirs),
        Gauge("x_in_flight", "In flight.", ["lane"], registry=theirs),
        Histogram("x_latency_seconds", "Latency.", ["lane"], buckets=BUCKETS, registry=theirs),
    )
    ours = CollectorRegistry()
    _fill(
        counter("x_requests", "Requests.", ["lane", "status"], ours),
        gauge("x_in_flight", "In flight.", ["lane"], ours),
        histogram("x_latency_seconds", "Latency.", ["lane"], BUCKETS, ours),
    )
    if created:
        # prometheus_client reads the variable once, at import; the families read it per scrape.
        assert "_created" not in _stable(ours)
        return
    assert _stable(ours) == _stable(theirs)


def test_a_removed_child_leaves_the_exposition_and_a_wrong_label_count_is_refused() -> None:
    registry = CollectorRegistry()
    up = gauge("x_up", "Up.", ["pool", "backend"], registry)
    up.labels("p", "b0").set(1)
    up.labels("p", "b1").set(0)
    up.remove("p", "b0")
    assert registry.get_sample_value("x_up", {"pool": "p", "backend": "b0"}) is None
    assert registry.get_sample_value("x_up", {"pool": "p", "backend": "b1"}) == 0.0
    with pytest.raises(ValueError, match="expected labels"):
        up.labels("p")


def test_a_counter_refuses_to_go_down_and_buckets_must_be_sorted() -> None:
    registry = CollectorRegistry()
    with pytest.raises(ValueError, match="non-negative"):
        counter("x_n", "N.", [], registry).labels().inc(-1)
    with pytest.raises(ValueError, match="sorted"):
        histogram("x_h", "H.", [], (1.0, 0.5), registry)


def test_an_observation_lands_in_the_first_bucket_whose_bound_holds_it() -> None:
    bounds = (0.001, 0.0025, 0.005, 0.01, 0.5, 1.0, 10.0)
    child = histogram("gap_seconds", "gaps", [], bounds, CollectorRegistry()).labels()
    edges = [b + d for b in bounds for d in (-1e-9, 0.0, 1e-9)]
    amounts = [-1.0, 0.0, *edges, 11.0, float("inf")]
    for amount in amounts:
        child.observe(amount)
    expected = [0.0] * (len(bounds) + 1)
    for amount in amounts:
        expected[bisect.bisect_left((*bounds, float("inf")), amount)] += 1.0
    assert child.counts == expected
    assert sum(child.counts) == len(amounts)


_bound = st.floats(min_value=-10.0, max_value=500.0, allow_nan=False)


@given(
    bounds=st.lists(_bound, min_size=0, max_size=30).map(sorted),
    amounts=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=30),
    near=st.lists(st.integers(min_value=-3, max_value=3), max_size=6),
)
@settings(max_examples=1500, deadline=None)
def test_the_bucket_table_finds_what_bisection_finds(
    bounds: list[float], amounts: list[float], near: list[int]
) -> None:
    buckets = Buckets((*bounds, float("inf")), ())
    edges = [*bounds, buckets.limit, 0.0]
    # Every bound and the table's own limit, and the floats next to them on either side.
    probes = [*amounts, *(_step(edge, n) for edge in edges for n in near)]
    child = HistogramValue(buckets)
    counts = [0.0] * len(buckets.bounds)
    for amount in probes:
        expected = bisect.bisect_left(buckets.bounds, amount)
        assert buckets.index(amount) == expected, (amount, buckets.bounds)
        child.observe(amount)
        counts[expected] += 1.0
        assert child.counts == counts, (amount, buckets.bounds)


def _step(x: float, n: int) -> float:
    for _ in range(abs(n)):
        x = math.nextafter(x, math.inf if n > 0 else -math.inf)
    return x


def test_the_latency_and_token_gap_buckets_are_found_by_the_table_to_a_second() -> None:
    for bounds in (LATENCY_BUCKETS, ITL_BUCKETS):
        buckets = Buckets((*bounds, float("inf")), ())
        assert buckets.limit >= 1.0
        amounts = [i / 100_000 for i in range(100_000)] + [_step(b, n) for b in bounds for n in (-1, 0, 1)]
        assert [buckets.index(a) for a in amounts] == [bisect.bisect_left(buckets.bounds, a) for a in amounts]
