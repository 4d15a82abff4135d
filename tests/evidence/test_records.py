from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from pydantic import ValidationError

from router.config.models import RequestClass
from router.evidence.reading import parse_record
from router.evidence.records import (
    Identity,
    LatencySummary,
    MeasuredSlice,
    TokenRange,
    canonical_content,
    dump_record,
)
from tests.evidence.factories import base_record, evolve


def test_record_id_is_sha256_of_canonical_content_without_the_id() -> None:
    record = base_record()
    content = orjson.loads(canonical_content(record))
    assert "record_id" not in content
    expected = "sha256:" + hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert record.record_id == expected


def test_file_form_round_trips_with_the_same_id() -> None:
    record = base_record()
    data = dump_record(record)
    assert orjson.loads(data)["record_id"] == record.record_id
    again = parse_record(data)
    assert again == record
    assert again.record_id == record.record_id
    assert dump_record(again) == data


def test_any_content_change_is_a_different_record() -> None:
    record = base_record()
    changed = evolve(record, {"measurements.ttft.p95_ms": 821.0})
    assert changed.record_id != record.record_id
    knob = evolve(record, {"context.knobs.max_num_seqs": 16})
    assert knob.record_id not in {record.record_id, changed.record_id}


def test_records_are_immutable() -> None:
    record = base_record()
    with pytest.raises(ValidationError):
        record.security_boundary_note = None  # type: ignore[misc]
    with pytest.raises(ValidationError):
        record.measurements.ttft.p95_ms = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        record.measured_slice.class_mix[RequestClass.RAG] = 0.5  # type: ignore[index]


def test_the_same_instant_in_another_time_zone_is_the_same_record() -> None:
    record = base_record()
    local = record.measured_at.astimezone(timezone(timedelta(hours=2)))
    again = evolve(record, {"measured_at": local.isoformat()})
    assert again.measured_at == datetime(2025, 6, 2, 9, 30, tzinfo=UTC)
    assert again.record_id == record.record_id


def test_whole_numbers_hash_alike_as_int_or_float() -> None:
    record = base_record()
    as_int = evolve(record, {"measurements.output_tokens_per_s": 236})
    assert as_int.record_id == record.record_id


def test_ranges_and_percentiles_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="min"):
        TokenRange(min=10, max=5)
    with pytest.raises(ValidationError, match="p50_ms"):
        LatencySummary(p50_ms=10.0, p95_ms=5.0)


def test_class_mix_shares_must_add_up_to_one() -> None:
    tokens = TokenRange(min=1, max=10)
    with pytest.raises(ValidationError, match="add up to 1"):
        MeasuredSlice(
            input_tokens=tokens,
            output_tokens=tokens,
            concurrency=1,
            class_mix={RequestClass.CHAT: 0.5, RequestClass.RAG: 0.4},
        )
    with pytest.raises(ValidationError, match=r"\(0, 1\]"):
        MeasuredSlice(
            input_tokens=tokens,
            output_tokens=tokens,
            concurrency=1,
            class_mix={RequestClass.CHAT: 0.0, RequestClass.RAG: 1.0},
        )
    ok = MeasuredSlice(
        input_tokens=tokens,
        output_tokens=tokens,
        concurrency=1,
        class_mix={RequestClass.RAG: 0.3, RequestClass.CHAT: 0.7},
    )
    assert list(ok.class_mix) == [RequestClass.CHAT, RequestClass.RAG]


def test_identity_missing_lists_absent_and_blank_fields() -> None:
    identity = Identity(
        model_revision=None,
        vllm_version=" ",
        server_configuration_hash=None,
        hardware_profile="cpu",
        served_model_name="m",
    )
    assert identity.missing() == ("model_revision", "vllm_version", "server_configuration_hash")
    assert base_record().identity.missing() == ()
