"""Properties of the decision and of record identity, over generated records and targets."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from router.config.models import PoolConfig
from router.config.vllm import VllmSettings
from router.evidence.decide import FinalDecision, RetestState, decide
from router.evidence.identity import knobs_hash, new_record, serving_configuration
from router.evidence.reading import parse_record
from router.evidence.records import (
    CapacityEvidenceRecord,
    LatencySummary,
    MeasuredSlice,
    MeasurementProtocol,
    Measurements,
    TokenRange,
    WarmupState,
    dump_record,
)
from router.evidence.targets import SloTargets, Target
from router.evidence.triggers import RetestTrigger

SLO = SloTargets()
RANK = {FinalDecision.PASS: 0, FinalDecision.CONDITIONAL: 1, FinalDecision.DEFER: 2}
bounded = settings(max_examples=60, deadline=None)


HEX = "0123456789abcdef"
# What pins weights: a full git commit, or the sha256 of the weights' manifest.
content_hashes = st.text(HEX, min_size=40, max_size=40) | st.text(HEX, min_size=64, max_size=64).map(
    lambda digest: "sha256:" + digest
)
EXTRA_ARGS = ("--enforce-eager", "--seed=7", "--disable-log-stats")


@st.composite
def vllm_settings(draw: st.DrawFn) -> VllmSettings:
    seqs = draw(st.integers(1, 256))
    return VllmSettings(
        version=draw(st.sampled_from(["0.26.0", "0.32.0", "0.33.1"])),
        model_revision=draw(content_hashes),
        hardware_profile=draw(st.sampled_from(["1x-gpu-24gb", "2x-gpu-48gb", "cpu-16c"])),
        max_model_len=draw(st.sampled_from([2048, 4096, 8192, 16384, 32768])),
        max_num_seqs=seqs,
        max_num_batched_tokens=draw(st.integers(max(seqs, 256), 16384)),
        tensor_parallel_size=draw(st.sampled_from([1, 2, 4, 8])),
        enable_prefix_caching=draw(st.booleans()),
        extra_args=tuple(draw(st.lists(st.sampled_from(EXTRA_ARGS), max_size=2, unique=True))),
    )


def pool_of(v: VllmSettings) -> PoolConfig:
    return PoolConfig.model_validate(
        {"backends": ["http://127.0.0.1:8101"], "model": "m", "vllm": v.model_dump()}
    )


@st.composite
def passing_records(draw: st.DrawFn, note: bool = True) -> tuple[PoolConfig, CapacityEvidenceRecord]:
    pool = pool_of(draw(vllm_settings()))
    ttft_p95 = draw(st.floats(1.0, SLO.p95_ttft_ms or 1800.0))
    record = new_record(
        pool,
        warmup=draw(st.sampled_from([WarmupState.DONE, WarmupState.SKIPPED])),
        protocol=MeasurementProtocol(
            tool="lane-router bench",
            workload_sha256="sha256:" + "a" * 64,
            duration_s=draw(st.floats(1.0, 3600.0)),
            sample_count=draw(st.integers(20, 10**6)),
        ),
        measured_slice=MeasuredSlice(
            input_tokens=TokenRange(min=1, max=draw(st.integers(1, 32768))),
            output_tokens=TokenRange(min=1, max=draw(st.integers(1, 8192))),
            concurrency=draw(st.integers(1, 512)),
        ),
        measurements=Measurements(
            ttft=LatencySummary(p50_ms=ttft_p95 / 2, p95_ms=ttft_p95),
            itl=LatencySummary(p50_ms=10.0, p95_ms=20.0),
            e2e=LatencySummary(p50_ms=1000.0, p95_ms=4000.0),
            output_tokens_per_s=draw(st.floats(120.0, 10_000.0)),
            error_count=0,
            timeout_count=0,
        ),
        measured_at=datetime(2025, 1, 1, tzinfo=UTC),
        security_boundary_note="router is the only way in" if note else None,
    )
    return pool, record


@st.composite
def inside_targets(draw: st.DrawFn, record: CapacityEvidenceRecord) -> Target:
    sl = record.measured_slice
    return Target(
        max_input_tokens=draw(st.integers(1, sl.input_tokens.max)),
        max_output_tokens=draw(st.integers(1, sl.output_tokens.max)),
        concurrency=draw(st.integers(1, sl.concurrency)),
    )


@bounded
@given(data=st.data(), note=st.booleans())
def test_a_target_inside_a_complete_passing_record_never_defers(data: st.DataObject, note: bool) -> None:
    pool, record = data.draw(passing_records(note=note))
    target = data.draw(inside_targets(record))
    decision = decide(record, target, serving_configuration(pool), SLO)
    expected = FinalDecision.PASS if note else FinalDecision.CONDITIONAL
    assert decision.final_decision == expected
    assert decision.retest_state == RetestState.NOT_REQUIRED


CHANGES: list[tuple[str, RetestTrigger, Any]] = [
    ("model_revision", RetestTrigger.MODEL_REVISION, lambda v: v[:-1] + ("1" if v.endswith("0") else "0")),
    ("version", RetestTrigger.VLLM_VERSION, lambda v: v + ".post1"),
    ("hardware_profile", RetestTrigger.HARDWARE_PROFILE, lambda v: v + "-b"),
    ("tensor_parallel_size", RetestTrigger.PARALLELISM, lambda v: v * 2),
    ("pipeline_parallel_size", RetestTrigger.PARALLELISM, lambda v: v + 1),
    ("data_parallel_size", RetestTrigger.PARALLELISM, lambda v: v + 1),
    ("max_model_len", RetestTrigger.MAX_MODEL_LEN, lambda v: v * 2),
    ("max_num_seqs", RetestTrigger.BATCHING_LIMITS, lambda v: max(1, v // 2) if v > 1 else 2),
    ("max_num_batched_tokens", RetestTrigger.BATCHING_LIMITS, lambda v: v + 256),
    ("enable_prefix_caching", RetestTrigger.CONFIG_HASH, lambda v: not v),
    ("block_size", RetestTrigger.CONFIG_HASH, lambda v: v * 2),
]


@bounded
@given(data=st.data(), change=st.sampled_from(CHANGES))
def test_any_decisive_change_triggers_a_retest(
    data: st.DataObject, change: tuple[str, RetestTrigger, Any]
) -> None:
    pool, record = data.draw(passing_records())
    target = data.draw(inside_targets(record))
    field, trigger, alter = change
    changed = pool.vllm.model_dump()
    changed[field] = alter(changed[field])
    current = serving_configuration(pool_of(VllmSettings.model_validate(changed)))
    decision = decide(record, target, current, SLO)
    assert trigger in decision.triggers
    assert decision.retest_state == RetestState.REQUIRED
    assert decision.final_decision == FinalDecision.DEFER


@bounded
@given(data=st.data(), dimension=st.sampled_from(["input", "output", "concurrency"]))
def test_a_target_beyond_any_measured_bound_defers(data: st.DataObject, dimension: str) -> None:
    pool, record = data.draw(passing_records())
    inside = data.draw(inside_targets(record))
    sl = record.measured_slice
    excess = data.draw(st.integers(1, 10_000))
    beyond = {
        "input": {"max_input_tokens": sl.input_tokens.max + excess},
        "output": {"max_output_tokens": sl.output_tokens.max + excess},
        "concurrency": {"concurrency": sl.concurrency + excess},
    }[dimension]
    target = Target.model_validate({**inside.model_dump(), **beyond})
    decision = decide(record, target, serving_configuration(pool), SLO)
    assert decision.final_decision == FinalDecision.DEFER
    assert decision.reason_class == "outside_measured_slice"


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    return value


@bounded
@given(data=st.data(), rng=st.randoms(use_true_random=False))
def test_identity_and_decision_are_stable_under_key_order(data: st.DataObject, rng: random.Random) -> None:
    pool, record = data.draw(passing_records())
    target = data.draw(inside_targets(record))
    raw = orjson.loads(dump_record(record))
    again = parse_record(orjson.dumps(shuffled(raw, rng)))
    assert again == record and again.record_id == record.record_id
    current = serving_configuration(pool)
    first = decide(record, target, current, SLO)
    assert decide(again, target, current, SLO) == first
    assert decide(record, target, current, SLO) == first


@bounded
@given(data=st.data(), note=st.booleans())
def test_a_smaller_target_is_never_judged_worse(data: st.DataObject, note: bool) -> None:
    pool, record = data.draw(passing_records(note=note))
    current = serving_configuration(pool)
    big = Target(
        max_input_tokens=data.draw(st.integers(1, 65536)),
        max_output_tokens=data.draw(st.integers(1, 16384)),
        concurrency=data.draw(st.integers(1, 1024)),
    )
    small = Target(
        max_input_tokens=data.draw(st.integers(1, big.max_input_tokens)),
        max_output_tokens=data.draw(st.integers(1, big.max_output_tokens)),
        concurrency=data.draw(st.integers(1, big.concurrency)),
    )
    worse = RANK[decide(record, small, current, SLO).final_decision]
    assert worse <= RANK[decide(record, big, current, SLO).final_decision]


@bounded
@given(data=st.data())
def test_a_record_of_any_pool_reads_back_with_its_knobs_matching_its_hash(data: st.DataObject) -> None:
    pool, record = data.draw(passing_records())
    assert knobs_hash(serving_configuration(pool)) == record.identity.server_configuration_hash
    assert parse_record(dump_record(record), "record.json") == record
