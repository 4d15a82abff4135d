"""Capacity evidence records, v1 (docs/evidence.md): what was configured and what was measured.

A record is immutable: every model is frozen, mappings are read-only, and its `record_id` is
the sha256 of its canonical JSON (orjson, sorted keys) without the id itself, so the same
content always yields the same id whatever order its keys were written in, and any change of
content — a different configuration, a new measurement — is a different record. Reading one
from bytes, with every check that entails, is `router.evidence.reading`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Final, Literal

import orjson
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_serializer,
    field_validator,
    model_validator,
)

from router.config.models import RequestClass
from router.config.vllm import VllmCapacity

SHA256_PATTERN = r"^sha256:[0-9a-f]{64}$"
# The shares of a class mix must add up to one, give or take float rounding.
MIX_SUM_TOLERANCE = 1e-6


class EvidenceError(Exception):
    """A record cannot be read, trusted or stored; the message names the file or field."""


class RecordExistsError(EvidenceError):
    """The store already holds a file for this record: records are never rewritten."""


class WarmupState(StrEnum):
    DONE = "done"
    SKIPPED = "skipped"  # deliberately: the measurement includes cold start
    UNKNOWN = "unknown"


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Identity(Frozen):
    """What the measured server *was*. `served_model_name` is an alias for people, never identity."""

    model_revision: str | None
    vllm_version: str | None
    server_configuration_hash: str | None = Field(pattern=SHA256_PATTERN)
    hardware_profile: str | None
    served_model_name: str = Field(min_length=1)

    def missing(self) -> tuple[str, ...]:
        """The identity fields that are absent or blank: provenance is incomplete without them."""
        values = {
            "model_revision": self.model_revision,
            "vllm_version": self.vllm_version,
            "server_configuration_hash": self.server_configuration_hash,
            "hardware_profile": self.hardware_profile,
        }
        return tuple(name for name, value in values.items() if not (value and value.strip()))


class CapacityKnobs(VllmCapacity):
    """Every server setting that bounds capacity, as the engine ran with it: the fields and
    bounds of router/config/vllm.py `VllmCapacity`, stated once there for profiles and records
    alike. An empty `extra_args` is left out of the record, so records of servers started without
    extra arguments keep the content — and the id — they always had."""

    # Read as the name the record states: whether vLLM takes it is for the configuration check
    # (router/evidence/reading.py), which names the knob a record's server could not have run.
    scheduling_policy: str = "fcfs"  # type: ignore[assignment]


class MeasurementProtocol(Frozen):
    tool: str
    workload_sha256: str | None = Field(pattern=SHA256_PATTERN)
    duration_s: float = Field(ge=0.0)
    sample_count: int = Field(ge=0)


class MeasurementContext(Frozen):
    knobs: CapacityKnobs
    warmup: WarmupState
    protocol: MeasurementProtocol


class TokenRange(Frozen):
    min: int = Field(ge=0)
    max: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> TokenRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be ≤ max ({self.max})")
        return self


class MeasuredSlice(Frozen):
    """The request shapes and load the measurement covered; the evidence says nothing beyond it.

    `concurrency` is the highest number of requests in flight during the measurement.
    `class_mix` maps each request class to its share of the requests (empty: not recorded).
    """

    input_tokens: TokenRange
    output_tokens: TokenRange
    concurrency: int = Field(ge=1)
    class_mix: Mapping[RequestClass, float] = Field(default_factory=dict)

    @field_validator("class_mix")
    @classmethod
    def _shares(cls, mix: Mapping[RequestClass, float]) -> Mapping[RequestClass, float]:
        return validated_mix(mix)

    @field_serializer("class_mix")
    def _plain_mix(self, mix: Mapping[RequestClass, float]) -> dict[str, float]:
        return {cls.value: share for cls, share in mix.items()}


def validated_mix(mix: Mapping[RequestClass, float]) -> Mapping[RequestClass, float]:
    """A read-only, sorted class mix whose shares lie in (0, 1] and add up to one."""
    for cls, share in mix.items():
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share of {cls.value!r} must be in (0, 1], got {share}")
    if mix and abs(sum(mix.values()) - 1.0) > MIX_SUM_TOLERANCE:
        raise ValueError(f"shares must add up to 1, got {sum(mix.values())}")
    return MappingProxyType(dict(sorted(mix.items())))


class LatencySummary(Frozen):
    p50_ms: float = Field(ge=0.0)
    p95_ms: float = Field(ge=0.0)

    @model_validator(mode="after")
    def _ordered(self) -> LatencySummary:
        if self.p50_ms > self.p95_ms:
            raise ValueError(f"p50_ms ({self.p50_ms}) must be ≤ p95_ms ({self.p95_ms})")
        return self


class Measurements(Frozen):
    ttft: LatencySummary
    itl: LatencySummary
    e2e: LatencySummary
    queue_time: LatencySummary | None = None
    output_tokens_per_s: float = Field(ge=0.0)
    requests_per_s: float | None = Field(None, ge=0.0)
    error_count: int = Field(ge=0)
    timeout_count: int = Field(ge=0)


class ServingConfiguration(Frozen):
    """A configuration identity to hold evidence against: the current one of a pool, or a record's."""

    identity: Identity
    knobs: CapacityKnobs


RECORD_VERSION: Final = 1


class CapacityEvidenceRecord(Frozen):
    record_version: Literal[1] = RECORD_VERSION
    identity: Identity
    context: MeasurementContext
    measured_slice: MeasuredSlice
    measurements: Measurements
    measured_at: AwareDatetime
    security_boundary_note: str | None = None
    supersedes: str | None = Field(None, pattern=SHA256_PATTERN)

    @field_validator("measured_at")
    @classmethod
    def _utc(cls, when: datetime) -> datetime:
        # One spelling per instant, so the id does not depend on the writer's time zone.
        return when.astimezone(UTC)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def record_id(self) -> str:
        # Not cached: `model_copy` would carry a cached id over to changed content.
        return "sha256:" + hashlib.sha256(canonical_content(self)).hexdigest()

    @property
    def configuration(self) -> ServingConfiguration:
        return ServingConfiguration(identity=self.identity, knobs=self.context.knobs)


def canonical_content(record: CapacityEvidenceRecord) -> bytes:
    """The bytes `record_id` hashes: every field but the id, keys sorted, no whitespace."""
    content = record.model_dump(mode="json", exclude={"record_id"})
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS)


def dump_record(record: CapacityEvidenceRecord) -> bytes:
    """The file form: canonical key order, indented for people, with the id stated."""
    return (
        orjson.dumps(record.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
        + b"\n"
    )
