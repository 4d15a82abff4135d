"""What a lane wants to run (its target slice) and what the product requires of it (SLO targets).

SLO targets are product choices, not properties of the engine; a bound set to `None` is not
checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import Field, field_serializer, field_validator

from router.config.models import RequestClass
from router.evidence.records import Frozen, Measurements, validated_mix


class Target(Frozen):
    """The slice a lane wants to run: request shape, requests in flight, optionally a class mix."""

    max_input_tokens: int = Field(ge=1)
    max_output_tokens: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    class_mix: Mapping[RequestClass, float] | None = None

    @field_validator("class_mix")
    @classmethod
    def _shares(cls, mix: Mapping[RequestClass, float] | None) -> Mapping[RequestClass, float] | None:
        return None if mix is None else validated_mix(mix)

    @field_serializer("class_mix")
    def _plain_mix(self, mix: Mapping[RequestClass, float] | None) -> dict[str, float] | None:
        return None if mix is None else {cls.value: share for cls, share in mix.items()}


class SloMetric(StrEnum):
    P95_TTFT = "p95_ttft"
    P95_ITL = "p95_itl"
    P95_E2E = "p95_e2e"
    P95_QUEUE_TIME = "p95_queue_time"
    THROUGHPUT = "throughput"
    ERRORS = "errors"
    TIMEOUTS = "timeouts"


class SloTargets(Frozen):
    p95_ttft_ms: float | None = Field(1800.0, gt=0)
    p95_itl_ms: float | None = Field(None, gt=0)
    # Off by default: end-to-end time grows with the output length a lane allows.
    p95_e2e_ms: float | None = Field(None, gt=0)
    p95_queue_time_ms: float | None = Field(None, gt=0)
    min_output_tokens_per_s: float | None = Field(120.0, ge=0)
    max_errors: int | None = Field(0, ge=0)
    max_timeouts: int | None = Field(0, ge=0)


def slo_misses(measured: Measurements, slo: SloTargets) -> tuple[SloMetric, ...]:
    """The SLO bounds the measurements miss, in `SloMetric` order.

    A bound on queue time that the record did not measure counts as missed: nothing shows it met.
    """
    queue_p95 = measured.queue_time.p95_ms if measured.queue_time is not None else None
    ceilings: tuple[tuple[SloMetric, float | None, float | None], ...] = (
        (SloMetric.P95_TTFT, measured.ttft.p95_ms, slo.p95_ttft_ms),
        (SloMetric.P95_ITL, measured.itl.p95_ms, slo.p95_itl_ms),
        (SloMetric.P95_E2E, measured.e2e.p95_ms, slo.p95_e2e_ms),
        (SloMetric.P95_QUEUE_TIME, queue_p95, slo.p95_queue_time_ms),
    )
    misses = [
        metric for metric, value, bound in ceilings if bound is not None and (value is None or value > bound)
    ]
    floor = slo.min_output_tokens_per_s
    if floor is not None and measured.output_tokens_per_s < floor:
        misses.append(SloMetric.THROUGHPUT)
    if slo.max_errors is not None and measured.error_count > slo.max_errors:
        misses.append(SloMetric.ERRORS)
    if slo.max_timeouts is not None and measured.timeout_count > slo.max_timeouts:
        misses.append(SloMetric.TIMEOUTS)
    return tuple(misses)
