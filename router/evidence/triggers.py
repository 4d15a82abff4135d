"""Retest triggers, declared up front: which differences between the measured configuration
and slice and the ones in use void the evidence.

Configuration triggers compare a record's identity and knobs with a current configuration;
slice triggers compare its measured slice with a target. Measuring a smaller slice than the target
never transfers: there is no extrapolation.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from router.config.models import RequestClass
from router.evidence.records import (
    CapacityEvidenceRecord,
    CapacityKnobs,
    MeasuredSlice,
    ServingConfiguration,
)
from router.evidence.targets import Target

# How far (total variation distance) a target's class mix may sit from the measured one.
CLASS_MIX_TOLERANCE = 0.10


class RetestTrigger(StrEnum):
    MODEL_REVISION = "model_revision"
    VLLM_VERSION = "vllm_version"
    HARDWARE_PROFILE = "hardware_profile"
    CONFIG_HASH = "config_hash"
    PARALLELISM = "parallelism"
    MAX_MODEL_LEN = "max_model_len"
    BATCHING_LIMITS = "batching_limits"
    REQUEST_SHAPE = "request_shape"
    CONCURRENCY = "concurrency"
    CLASS_MIX = "class_mix"


CONFIGURATION_TRIGGERS = frozenset(
    {
        RetestTrigger.MODEL_REVISION,
        RetestTrigger.VLLM_VERSION,
        RetestTrigger.HARDWARE_PROFILE,
        RetestTrigger.CONFIG_HASH,
        RetestTrigger.PARALLELISM,
        RetestTrigger.MAX_MODEL_LEN,
        RetestTrigger.BATCHING_LIMITS,
    }
)
SLICE_TRIGGERS = frozenset(
    {
        RetestTrigger.REQUEST_SHAPE,
        RetestTrigger.CONCURRENCY,
        RetestTrigger.CLASS_MIX,
    }
)

# Knobs grouped by the trigger they fire. Knobs outside these groups (prefix caching, dtype,
# block size, …) still change the configuration hash and fire CONFIG_HASH.
KNOB_TRIGGERS: tuple[tuple[RetestTrigger, tuple[str, ...]], ...] = (
    (RetestTrigger.PARALLELISM, ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")),
    (RetestTrigger.MAX_MODEL_LEN, ("max_model_len",)),
    (
        RetestTrigger.BATCHING_LIMITS,
        (
            "max_num_batched_tokens",
            "max_num_seqs",
            "max_num_active_seqs",
            "max_num_queued_reqs",
            "max_num_queued_tokens",
            "long_prefill_token_threshold",
            "max_num_partial_prefills",
            "max_long_partial_prefills",
        ),
    ),
)


def ordered(triggers: frozenset[RetestTrigger]) -> tuple[RetestTrigger, ...]:
    """Triggers in declaration order, for stable output."""
    return tuple(t for t in RetestTrigger if t in triggers)


def configuration_triggers(
    measured: ServingConfiguration, current: ServingConfiguration
) -> frozenset[RetestTrigger]:
    a, b = measured.identity, current.identity
    fired = {
        trigger
        for trigger, before, after in (
            (RetestTrigger.MODEL_REVISION, a.model_revision, b.model_revision),
            (RetestTrigger.VLLM_VERSION, a.vllm_version, b.vllm_version),
            (RetestTrigger.HARDWARE_PROFILE, a.hardware_profile, b.hardware_profile),
            (RetestTrigger.CONFIG_HASH, a.server_configuration_hash, b.server_configuration_hash),
        )
        if before != after
    }
    return frozenset(fired) | knob_triggers(measured.knobs, current.knobs)


def knob_triggers(measured: CapacityKnobs, current: CapacityKnobs) -> frozenset[RetestTrigger]:
    return frozenset(
        trigger
        for trigger, names in KNOB_TRIGGERS
        if any(getattr(measured, name) != getattr(current, name) for name in names)
    )


def slice_triggers(measured: MeasuredSlice, target: Target) -> frozenset[RetestTrigger]:
    fired: set[RetestTrigger] = set()
    if (
        target.max_input_tokens > measured.input_tokens.max
        or target.max_output_tokens > measured.output_tokens.max
    ):
        fired.add(RetestTrigger.REQUEST_SHAPE)
    if target.concurrency > measured.concurrency:
        fired.add(RetestTrigger.CONCURRENCY)
    if target.class_mix is not None and not mix_covered(measured.class_mix, target.class_mix):
        fired.add(RetestTrigger.CLASS_MIX)
    return frozenset(fired)


def mix_covered(measured: Mapping[RequestClass, float], target: Mapping[RequestClass, float]) -> bool:
    """Every targeted class was measured, and the mixes differ by at most the tolerance."""
    if any(cls not in measured for cls in target):
        return False
    classes = set(measured) | set(target)
    distance = sum(abs(measured.get(c, 0.0) - target.get(c, 0.0)) for c in classes) / 2
    return distance <= CLASS_MIX_TOLERANCE


def retest_triggers(
    record: CapacityEvidenceRecord, current: ServingConfiguration, target: Target | None = None
) -> frozenset[RetestTrigger]:
    """Exactly the triggers that fire when `record` is held against `current` (and `target`)."""
    fired = configuration_triggers(record.configuration, current)
    if target is not None:
        fired |= slice_triggers(record.measured_slice, target)
    return fired
