"""Records, configurations and targets for the evidence unit tests.

Config A (TP=1, 8,192-token context, 8 sequences) with a hand-written record of its chat slice
(input ≤ 2,048, output ≤ 512, concurrency ≤ 8), and config B (TP=2, 16,384 context). The
figures are fixtures for the decision logic, not measurements; the measured worked example is
`lane-router evidence example` (tests/evidence/test_example.py).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import orjson

from router.config.load import parse_profile
from router.config.models import ProfileConfig, RequestClass
from router.config.vllm import VllmSettings
from router.evidence.boundary import security_boundary_note
from router.evidence.identity import knobs_hash, new_record, serving_configuration, workload_sha256
from router.evidence.records import (
    CapacityEvidenceRecord,
    LatencySummary,
    MeasuredSlice,
    MeasurementProtocol,
    Measurements,
    ServingConfiguration,
    TokenRange,
    WarmupState,
    dump_record,
)
from router.evidence.targets import Target

MODEL = "lane-router/example-instruct"
POOL = "main"
WORKLOAD = b"chat: input 64-2048 tokens, output 16-512 tokens, 8 closed-loop clients, seed 7\n"


def config_a() -> VllmSettings:
    return VllmSettings(
        version="0.32.0",
        model_revision="5f1e0c2a9b7d4e3f8a6c1b0d2e4f6a8c9b7d5e3f",
        max_model_len=8192,
        max_num_batched_tokens=2048,
        max_num_seqs=8,
        tensor_parallel_size=1,
        hardware_profile="2x-gpu-48gb",
    )


def config_b() -> VllmSettings:
    changes = {"tensor_parallel_size": 2, "max_model_len": 16384}
    return VllmSettings.model_validate({**config_a().model_dump(), **changes})


def example_profile(
    settings: VllmSettings, *, max_in_flight: int, max_prompt: int, max_output: int
) -> ProfileConfig:
    """One pool serving every lane; the chat lane carries the limits the evidence is about."""
    data = example_profile_data(
        settings, max_in_flight=max_in_flight, max_prompt=max_prompt, max_output=max_output
    )
    return parse_profile(data, "evidence-example")


def example_profile_data(
    settings: VllmSettings, *, max_in_flight: int, max_prompt: int, max_output: int
) -> dict[str, object]:
    """The profile file's content, as it would be written in YAML."""
    lanes: dict[str, dict[str, object]] = {cls.value: {"pool": POOL} for cls in RequestClass}
    lanes[RequestClass.CHAT.value] = {
        "pool": POOL,
        "max_in_flight": max_in_flight,
        "max_prompt_tokens": max_prompt,
        "max_output_tokens": max_output,
    }
    return {
        "profile": "evidence-example",
        "pools": {
            POOL: {
                "backends": ["http://127.0.0.1:8101"],
                "model": MODEL,
                "upstream_api_key_env": "POOL_MAIN_KEY",
                "vllm": settings.model_dump(mode="json"),
            }
        },
        "lanes": lanes,
        "keys": [
            {"name": "web", "sha256": _digest(b"example web key"), "classes": ["chat"]},
            {"name": "ops", "sha256": _digest(b"example ops key"), "admin": True},
        ],
    }


def profile_a() -> ProfileConfig:
    return example_profile(config_a(), max_in_flight=8, max_prompt=2048, max_output=512)


def profile_b() -> ProfileConfig:
    return example_profile(config_b(), max_in_flight=12, max_prompt=4096, max_output=1024)


def record_a() -> CapacityEvidenceRecord:
    """The measurement of config A's chat slice."""
    return measured(config_a())


def measured(settings: VllmSettings) -> CapacityEvidenceRecord:
    """The chat slice of config A's measurement, taken on a pool with `settings`."""
    cfg = example_profile(settings, max_in_flight=8, max_prompt=2048, max_output=512)
    return new_record(
        cfg.pools[POOL],
        warmup=WarmupState.DONE,
        protocol=MeasurementProtocol(
            tool="lane-router bench",
            workload_sha256=workload_sha256(WORKLOAD),
            duration_s=600.0,
            sample_count=1200,
        ),
        measured_slice=MeasuredSlice(
            input_tokens=TokenRange(min=64, max=2048),
            output_tokens=TokenRange(min=16, max=512),
            concurrency=8,
            class_mix={RequestClass.CHAT: 1.0},
        ),
        measurements=Measurements(
            ttft=LatencySummary(p50_ms=310.0, p95_ms=820.0),
            itl=LatencySummary(p50_ms=28.0, p95_ms=41.0),
            e2e=LatencySummary(p50_ms=9100.0, p95_ms=14200.0),
            queue_time=LatencySummary(p50_ms=3.0, p95_ms=40.0),
            output_tokens_per_s=236.0,
            requests_per_s=0.9,
            error_count=0,
            timeout_count=0,
        ),
        measured_at=datetime(2025, 6, 2, 9, 30, tzinfo=UTC),
        security_boundary_note=security_boundary_note(cfg),
    )


def _digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


BASE_TARGET = Target(max_input_tokens=2048, max_output_tokens=512, concurrency=8)


def evolve(record: CapacityEvidenceRecord, changes: dict[str, Any]) -> CapacityEvidenceRecord:
    """A new, validated record in memory: `record` with the dotted paths of `changes` set.

    Not read from a file: a record whose knobs no longer match its configuration hash is fine for
    the decision's unit tests, but a store refuses it (see `rehashed`).
    """
    data = record.model_dump(mode="json", exclude={"record_id"})
    _set_paths(data, changes)
    return CapacityEvidenceRecord.model_validate(data)


def rehashed(record: CapacityEvidenceRecord) -> CapacityEvidenceRecord:
    """`record` with the configuration hash of its own knobs, as a measurement of them would have."""
    return evolve(record, {"identity.server_configuration_hash": knobs_hash(record.configuration)})


def edited(record: CapacityEvidenceRecord, changes: dict[str, Any], *, restate_id: bool = False) -> bytes:
    """The file of `record` edited by hand: the dotted paths of `changes` set (a value of
    `DELETE` removes the field), the stated id kept as it was — or, with `restate_id`, replaced
    by the hash of the edited content, as a forger would."""
    data = orjson.loads(dump_record(record))
    _set_paths(data, changes)
    if restate_id:
        content = {key: value for key, value in data.items() if key != "record_id"}
        data["record_id"] = "sha256:" + _digest(orjson.dumps(content, option=orjson.OPT_SORT_KEYS))
    return orjson.dumps(data, option=orjson.OPT_INDENT_2)


DELETE = object()


def _set_paths(data: dict[str, Any], changes: dict[str, Any]) -> None:
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value


def base_record() -> CapacityEvidenceRecord:
    return record_a()


def current_a() -> ServingConfiguration:
    return serving_configuration(profile_a().pools[POOL])


def current_for(settings: VllmSettings) -> ServingConfiguration:
    cfg = example_profile(settings, max_in_flight=8, max_prompt=2048, max_output=512)
    return serving_configuration(cfg.pools[POOL])
