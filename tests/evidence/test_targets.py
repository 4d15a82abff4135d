from __future__ import annotations

import pytest
from pydantic import ValidationError

from router.evidence.records import LatencySummary, Measurements
from router.evidence.targets import SloMetric, SloTargets, Target, slo_misses


def _measured(**changes: object) -> Measurements:
    base = Measurements(
        ttft=LatencySummary(p50_ms=300.0, p95_ms=1800.0),
        itl=LatencySummary(p50_ms=20.0, p95_ms=50.0),
        e2e=LatencySummary(p50_ms=5000.0, p95_ms=9000.0),
        queue_time=LatencySummary(p50_ms=1.0, p95_ms=30.0),
        output_tokens_per_s=120.0,
        error_count=0,
        timeout_count=0,
    )
    return Measurements.model_validate({**base.model_dump(), **changes})


def test_values_on_the_bound_meet_it() -> None:
    assert slo_misses(_measured(), SloTargets()) == ()


@pytest.mark.parametrize(
    ("changes", "slo", "metric"),
    [
        ({"ttft": {"p50_ms": 300.0, "p95_ms": 1800.5}}, SloTargets(), SloMetric.P95_TTFT),
        ({"output_tokens_per_s": 119.9}, SloTargets(), SloMetric.THROUGHPUT),
        ({"error_count": 1}, SloTargets(), SloMetric.ERRORS),
        ({"timeout_count": 1}, SloTargets(), SloMetric.TIMEOUTS),
        ({}, SloTargets(p95_itl_ms=40.0), SloMetric.P95_ITL),
        ({}, SloTargets(p95_e2e_ms=8000.0), SloMetric.P95_E2E),
        ({}, SloTargets(p95_queue_time_ms=10.0), SloMetric.P95_QUEUE_TIME),
        ({"queue_time": None}, SloTargets(p95_queue_time_ms=10_000.0), SloMetric.P95_QUEUE_TIME),
    ],
)
def test_each_missed_bound_is_named(changes: dict[str, object], slo: SloTargets, metric: SloMetric) -> None:
    assert slo_misses(_measured(**changes), slo) == (metric,)


def test_a_bound_set_to_none_is_not_checked() -> None:
    bad = _measured(
        error_count=5, timeout_count=2, output_tokens_per_s=1.0, ttft={"p50_ms": 1.0, "p95_ms": 99_999.0}
    )
    assert len(slo_misses(bad, SloTargets())) == 4
    off = SloTargets(p95_ttft_ms=None, min_output_tokens_per_s=None, max_errors=None, max_timeouts=None)
    assert slo_misses(bad, off) == ()


def test_targets_are_validated() -> None:
    with pytest.raises(ValidationError):
        Target(max_input_tokens=0, max_output_tokens=1, concurrency=1)
    with pytest.raises(ValidationError):
        SloTargets(p95_ttft_ms=-1.0)
