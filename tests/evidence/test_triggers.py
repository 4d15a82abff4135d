from __future__ import annotations

import pytest

from router.config.models import RequestClass
from router.config.vllm import VllmSettings
from router.evidence.identity import capacity_knobs, serving_configuration
from router.evidence.records import MeasuredSlice, TokenRange
from router.evidence.targets import Target
from router.evidence.triggers import (
    RetestTrigger,
    configuration_triggers,
    ordered,
    retest_triggers,
    slice_triggers,
)
from tests.evidence.factories import (
    BASE_TARGET,
    MODEL,
    POOL,
    base_record,
    config_a,
    current_a,
    current_for,
    example_profile,
)

T = RetestTrigger


def _changed(**changes: object) -> VllmSettings:
    return VllmSettings.model_validate({**config_a().model_dump(), **changes})


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"model_revision": "0" * 40}, {T.MODEL_REVISION, T.CONFIG_HASH}),
        ({"version": "0.33.0"}, {T.VLLM_VERSION, T.CONFIG_HASH}),
        ({"hardware_profile": "8x-gpu-80gb"}, {T.HARDWARE_PROFILE}),
        ({"tensor_parallel_size": 2}, {T.PARALLELISM, T.CONFIG_HASH}),
        ({"pipeline_parallel_size": 2}, {T.PARALLELISM, T.CONFIG_HASH}),
        ({"data_parallel_size": 2}, {T.PARALLELISM, T.CONFIG_HASH}),
        ({"max_model_len": 16384}, {T.MAX_MODEL_LEN, T.CONFIG_HASH}),
        ({"max_num_seqs": 16}, {T.BATCHING_LIMITS, T.CONFIG_HASH}),
        ({"max_num_batched_tokens": 4096}, {T.BATCHING_LIMITS, T.CONFIG_HASH}),
        ({"long_prefill_token_threshold": 512}, {T.BATCHING_LIMITS, T.CONFIG_HASH}),
        ({"enable_prefix_caching": False}, {T.CONFIG_HASH}),
        ({"gpu_memory_utilization": 0.8}, {T.CONFIG_HASH}),
        ({"extra_args": ("--enforce-eager",)}, {T.CONFIG_HASH}),
        ({}, set()),
    ],
)
def test_each_decisive_change_fires_exactly_its_triggers(
    changes: dict[str, object], expected: set[RetestTrigger]
) -> None:
    fired = configuration_triggers(base_record().configuration, current_for(_changed(**changes)))
    assert fired == expected


def test_serving_another_model_name_changes_the_hash_only() -> None:
    cfg = example_profile(config_a(), max_in_flight=8, max_prompt=2048, max_output=512)
    renamed = cfg.pools[POOL].model_copy(update={"model": MODEL + "-v2"})
    fired = configuration_triggers(base_record().configuration, serving_configuration(renamed))
    assert fired == {T.CONFIG_HASH}


def test_removed_partial_prefill_flags_are_not_part_of_the_knobs() -> None:
    old = VllmSettings(version="0.26.0", max_num_partial_prefills=4)
    new = VllmSettings(version="0.32.0")
    assert capacity_knobs(old).max_num_partial_prefills == 4
    assert capacity_knobs(new).max_num_partial_prefills is None


def _slice(mix: dict[RequestClass, float] | None = None) -> MeasuredSlice:
    return MeasuredSlice(
        input_tokens=TokenRange(min=64, max=2048),
        output_tokens=TokenRange(min=16, max=512),
        concurrency=8,
        class_mix=mix or {},
    )


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (Target(max_input_tokens=2048, max_output_tokens=512, concurrency=8), set()),
        (Target(max_input_tokens=100, max_output_tokens=10, concurrency=1), set()),
        (Target(max_input_tokens=2049, max_output_tokens=512, concurrency=8), {T.REQUEST_SHAPE}),
        (Target(max_input_tokens=2048, max_output_tokens=513, concurrency=8), {T.REQUEST_SHAPE}),
        (Target(max_input_tokens=2048, max_output_tokens=512, concurrency=9), {T.CONCURRENCY}),
        (
            Target(max_input_tokens=4096, max_output_tokens=1024, concurrency=12),
            {T.REQUEST_SHAPE, T.CONCURRENCY},
        ),
    ],
)
def test_a_target_beyond_the_measured_slice_fires_slice_triggers(
    target: Target, expected: set[RetestTrigger]
) -> None:
    assert slice_triggers(_slice(), target) == expected


C, R, B = RequestClass.CHAT, RequestClass.RAG, RequestClass.BATCH


@pytest.mark.parametrize(
    ("measured", "wanted", "fires"),
    [
        ({C: 1.0}, {C: 1.0}, False),
        ({C: 0.7, R: 0.3}, {C: 0.75, R: 0.25}, False),
        ({C: 0.7, R: 0.3}, {C: 0.5, R: 0.5}, True),
        ({C: 0.95, R: 0.05}, {C: 0.95, B: 0.05}, True),
        (None, {C: 1.0}, True),
    ],
)
def test_a_class_mix_must_have_been_measured(
    measured: dict[RequestClass, float] | None, wanted: dict[RequestClass, float], fires: bool
) -> None:
    target = BASE_TARGET.model_copy(update={"class_mix": wanted})
    target = Target.model_validate(target.model_dump())
    assert (T.CLASS_MIX in slice_triggers(_slice(measured), target)) is fires


def test_retest_triggers_join_configuration_and_slice() -> None:
    wide = Target(max_input_tokens=4096, max_output_tokens=512, concurrency=8)
    fired = retest_triggers(base_record(), current_for(_changed(max_num_seqs=4)), wide)
    assert ordered(fired) == (T.CONFIG_HASH, T.BATCHING_LIMITS, T.REQUEST_SHAPE)
    assert retest_triggers(base_record(), current_a()) == frozenset()
