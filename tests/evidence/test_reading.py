"""Reading a record: each way a file can be unusable is refused, in one line that names it."""

from __future__ import annotations

import orjson
import pytest

from router.evidence.decide import decide
from router.evidence.identity import knobs_hash
from router.evidence.reading import parse_record
from router.evidence.records import CapacityEvidenceRecord, EvidenceError, dump_record
from router.evidence.targets import SloTargets
from tests.evidence.factories import (
    BASE_TARGET,
    DELETE,
    base_record,
    config_a,
    current_a,
    edited,
    evolve,
    measured,
    rehashed,
)


def refusal(data: bytes, source: str = "r.json") -> str:
    with pytest.raises(EvidenceError) as caught:
        parse_record(data, source)
    message = str(caught.value)
    assert message.startswith(f"{source}: ")
    assert "\n" not in message
    return message


def test_a_record_reads_back_as_written() -> None:
    record = base_record()
    assert parse_record(dump_record(record)) == record


def test_a_record_without_its_id_is_refused_even_when_otherwise_valid() -> None:
    assert "no record_id" in refusal(edited(base_record(), {"record_id": DELETE}))


def test_an_edit_with_the_id_removed_is_refused() -> None:
    slow = evolve(base_record(), {"measurements.ttft.p95_ms": 2400.0})
    hidden = edited(slow, {"measurements.ttft.p95_ms": 800.0, "record_id": DELETE})
    assert "no record_id" in refusal(hidden)


def test_a_stated_id_that_does_not_match_the_content_is_refused() -> None:
    message = refusal(edited(base_record(), {"measurements.error_count": 3}))
    assert "does not match its content" in message and base_record().record_id in message


def test_a_stated_id_must_be_a_string() -> None:
    assert "record_id must be a string" in refusal(edited(base_record(), {"record_id": 7}))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("context.knobs.max_num_seqs", "8"),
        ("context.knobs.max_num_seqs", 8.0),
        ("measured_slice.concurrency", "8"),
        ("measurements.error_count", False),
        ("measurements.ttft.p95_ms", "820"),
        ("context.knobs.enable_prefix_caching", "true"),
        ("context.knobs.enable_prefix_caching", 1),
        ("context.protocol.sample_count", "1200"),
    ],
)
def test_values_of_the_wrong_type_are_refused_not_coerced(path: str, value: object) -> None:
    message = refusal(edited(base_record(), {path: value}, restate_id=True))
    assert f"{path}: Input should be a valid" in message
    assert f"(got {value!r})" in message


@pytest.mark.parametrize("version", [2, 0, "1", True, 1.0, None])
def test_an_unknown_record_version_is_refused(version: object) -> None:
    message = refusal(edited(base_record(), {"record_version": version}, restate_id=True))
    assert f"record_version {version!r} is unknown" in message
    assert "reads version 1 records" in message


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"unexpected": 1}, "unexpected"),
        ({"identity.served_model_name": DELETE}, "identity.served_model_name: Field required"),
        ({"context.warmup": "maybe"}, "context.warmup"),
        ({"supersedes": "not-a-hash"}, "supersedes"),
        ({"measured_at": "2025-06-02T09:30:00"}, "measured_at"),
    ],
)
def test_invalid_records_name_the_offending_field(changes: dict[str, object], fragment: str) -> None:
    assert fragment in refusal(edited(base_record(), changes, restate_id=True))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "empty file, not a record"),
        (b"  \n", "empty file, not a record"),
        (b"{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "a record is a JSON object, not list"),
    ],
)
def test_what_is_not_a_record_object_is_refused(data: bytes, fragment: str) -> None:
    assert fragment in refusal(data)


@pytest.mark.parametrize(
    "changes",
    [
        {"context.knobs.max_num_seqs": 16},
        {"context.knobs.tensor_parallel_size": 2},
        {"context.knobs.extra_args": ["--enforce-eager"]},
        {"identity.vllm_version": "0.33.0"},
        {"identity.model_revision": "0" * 40},
        {"identity.served_model_name": "another/model"},
    ],
)
def test_knobs_that_disagree_with_the_configuration_hash_are_refused(changes: dict[str, object]) -> None:
    # The id is restated, as a forger would: only the hash check can tell.
    message = refusal(edited(base_record(), changes, restate_id=True))
    assert "is not the hash of the record's own knobs" in message
    assert base_record().identity.server_configuration_hash in message


def test_knobs_no_vllm_server_could_run_are_refused() -> None:
    changes = {"context.knobs.scheduling_policy": "random"}
    message = refusal(edited(base_record(), changes, restate_id=True))
    assert "context.knobs are no vLLM configuration: scheduling_policy" in message


def test_a_reconfigured_record_with_its_own_hash_reads() -> None:
    record = rehashed(evolve(base_record(), {"context.knobs.max_num_seqs": 16}))
    assert parse_record(dump_record(record)) == record


def test_extra_arguments_are_knobs_the_hash_covers() -> None:
    plain = base_record()
    assert "extra_args" not in orjson.loads(dump_record(plain))["context"]["knobs"]
    eager = measured(config_a().model_copy(update={"extra_args": ("--enforce-eager",)}))
    assert eager.context.knobs.extra_args == ("--enforce-eager",)
    assert eager.identity.server_configuration_hash != plain.identity.server_configuration_hash
    assert knobs_hash(eager.configuration) == eager.identity.server_configuration_hash
    assert parse_record(dump_record(eager)) == eager


def test_a_record_without_a_vllm_version_reads_but_never_passes() -> None:
    # The hash covers the version: without it the knobs cannot be held against the hash.
    record = evolve(base_record(), {"identity.vllm_version": None})
    again = parse_record(dump_record(record))
    assert isinstance(again, CapacityEvidenceRecord)
    decision = decide(again, BASE_TARGET, current_a(), SloTargets())
    assert (decision.final_decision, decision.reason_class) == ("DEFER", "provenance_incomplete")
