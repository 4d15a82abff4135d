"""The eight reference cases of the decision (docs/evidence.md), and the rules around them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from router.config.vllm import VllmSettings
from router.evidence.decide import DECISION_FIELDS, Decision, decide, no_evidence
from router.evidence.provenance import GapKind
from router.evidence.records import CapacityEvidenceRecord, ServingConfiguration
from router.evidence.targets import SloMetric, SloTargets, Target
from router.evidence.triggers import RetestTrigger
from tests.evidence.factories import (
    BASE_TARGET,
    base_record,
    config_a,
    config_b,
    current_a,
    current_for,
    evolve,
)


@dataclass(frozen=True)
class Case:
    record: CapacityEvidenceRecord
    target: Target
    current: ServingConfiguration
    expected: tuple[str, ...]
    triggers: tuple[RetestTrigger, ...] = ()
    misses: tuple[SloMetric, ...] = ()


COMMIT_A = config_a().model_revision or ""


def _settings_a(**changes: object) -> VllmSettings:
    return VllmSettings.model_validate({**config_a().model_dump(), **changes})


def reference_cases() -> dict[str, Case]:
    record = base_record()
    return {
        "valid baseline": Case(
            record,
            BASE_TARGET,
            current_a(),
            (
                "complete",
                "qualified",
                "inside",
                "meets_slo",
                "documented",
                "not_required",
                "PASS",
                "within_measured_evidence",
            ),
        ),
        "target outside measured concurrency": Case(
            record,
            BASE_TARGET.model_copy(update={"concurrency": 12}),
            current_a(),
            (
                "complete",
                "qualified",
                "outside",
                "meets_slo",
                "documented",
                "required",
                "DEFER",
                "outside_measured_slice",
            ),
            triggers=(RetestTrigger.CONCURRENCY,),
        ),
        "changed config hash": Case(
            record,
            BASE_TARGET,
            current_for(_settings_a(enable_prefix_caching=False)),
            (
                "mismatch",
                "qualified",
                "inside",
                "meets_slo",
                "documented",
                "required",
                "DEFER",
                "configuration_changed",
            ),
            triggers=(RetestTrigger.CONFIG_HASH,),
        ),
        "incomplete provenance": Case(
            evolve(record, {"identity.hardware_profile": None}),
            BASE_TARGET,
            current_for(_settings_a(hardware_profile=None)),
            (
                "incomplete",
                "qualified",
                "inside",
                "meets_slo",
                "documented",
                "required",
                "DEFER",
                "provenance_incomplete",
            ),
        ),
        "unknown warmup": Case(
            evolve(record, {"context.warmup": "unknown"}),
            BASE_TARGET,
            current_a(),
            (
                "complete",
                "warmup_unknown",
                "inside",
                "meets_slo",
                "documented",
                "required",
                "DEFER",
                "warmup_unknown",
            ),
        ),
        "SLO failure": Case(
            evolve(record, {"measurements.ttft.p95_ms": 2400.0}),
            BASE_TARGET,
            current_a(),
            (
                "complete",
                "qualified",
                "inside",
                "misses_slo",
                "documented",
                "not_required",
                "DEFER",
                "slo_missed",
            ),
            misses=(SloMetric.P95_TTFT,),
        ),
        "missing security boundary note": Case(
            evolve(record, {"security_boundary_note": None}),
            BASE_TARGET,
            current_a(),
            (
                "complete",
                "qualified",
                "inside",
                "meets_slo",
                "missing",
                "not_required",
                "CONDITIONAL",
                "boundary_note_missing",
            ),
        ),
        "transfer to a larger context and concurrency": Case(
            record,
            Target(max_input_tokens=4096, max_output_tokens=1024, concurrency=12),
            current_for(config_b()),
            (
                "mismatch",
                "qualified",
                "outside",
                "meets_slo",
                "documented",
                "required",
                "DEFER",
                "configuration_changed",
            ),
            triggers=(
                RetestTrigger.CONFIG_HASH,
                RetestTrigger.PARALLELISM,
                RetestTrigger.MAX_MODEL_LEN,
                RetestTrigger.REQUEST_SHAPE,
                RetestTrigger.CONCURRENCY,
            ),
        ),
    }


@pytest.mark.parametrize("name", list(reference_cases()))
def test_reference_case(name: str) -> None:
    case = reference_cases()[name]
    decision = decide(case.record, case.target, case.current, SloTargets())
    assert tuple(value for _, value in decision.fields()) == case.expected
    assert decision.triggers == case.triggers
    assert decision.slo_misses == case.misses
    assert decision.record_id == case.record.record_id


def test_decision_fields_are_the_eight_in_order() -> None:
    decision = decide(base_record(), BASE_TARGET, current_a(), SloTargets())
    assert [name for name, _ in decision.fields()] == [
        "provenance_state",
        "measurement_state",
        "slice_state",
        "service_state",
        "security_boundary_state",
        "retest_state",
        "final_decision",
        "reason_class",
    ]
    assert tuple(name for name, _ in decision.fields()) == DECISION_FIELDS


def test_incomplete_provenance_names_the_missing_fields_on_both_sides() -> None:
    record = evolve(base_record(), {"identity.model_revision": None})
    decision = decide(record, BASE_TARGET, current_for(_settings_a(model_revision=None)), SloTargets())
    assert decision.missing_identity == ("model_revision", "current.model_revision")
    assert decision.reason_class == "provenance_incomplete"


@pytest.mark.parametrize(
    ("record_revision", "current_revision", "gaps"),
    [
        ("main", "main", ("model_revision", "current.model_revision")),
        (COMMIT_A, "v1.0", ("current.model_revision",)),
        ("v1.0", COMMIT_A, ("model_revision",)),
    ],
)
def test_a_revision_that_names_no_fixed_weights_is_incomplete_provenance(
    record_revision: str, current_revision: str, gaps: tuple[str, ...]
) -> None:
    record = evolve(base_record(), {"identity.model_revision": record_revision})
    current = current_for(_settings_a(model_revision=current_revision))
    decision = decide(record, BASE_TARGET, current, SloTargets())
    assert (decision.final_decision, decision.reason_class) == ("DEFER", "provenance_incomplete")
    assert tuple(gap.field for gap in decision.provenance_gaps) == gaps
    assert {gap.kind for gap in decision.provenance_gaps} == {GapKind.MOVING_REVISION}
    assert decision.missing_identity == ()
    assert decision.retest_state == "required"


def test_the_served_model_name_is_an_alias_not_identity() -> None:
    record = evolve(base_record(), {"identity.served_model_name": "chat-default"})
    decision = decide(record, BASE_TARGET, current_a(), SloTargets())
    assert decision.final_decision == "PASS"
    assert decision.triggers == ()


def test_deliberately_skipped_warmup_qualifies() -> None:
    record = evolve(base_record(), {"context.warmup": "skipped"})
    assert decide(record, BASE_TARGET, current_a(), SloTargets()).final_decision == "PASS"


@pytest.mark.parametrize(
    ("changes", "state"),
    [
        ({"context.protocol.workload_sha256": None}, "protocol_incomplete"),
        ({"context.protocol.duration_s": 0.0}, "protocol_incomplete"),
        ({"context.protocol.tool": " "}, "protocol_incomplete"),
        ({"context.protocol.sample_count": 19}, "too_few_samples"),
    ],
)
def test_an_incomplete_protocol_does_not_qualify(changes: dict[str, object], state: str) -> None:
    decision = decide(evolve(base_record(), changes), BASE_TARGET, current_a(), SloTargets())
    assert decision.measurement_state == state
    assert (decision.final_decision, decision.reason_class) == ("DEFER", state)
    assert decision.retest_state == "required"


def test_gates_apply_in_order() -> None:
    slow_and_unnoted = evolve(
        base_record(), {"measurements.ttft.p95_ms": 2400.0, "security_boundary_note": "  "}
    )
    decision = decide(slow_and_unnoted, BASE_TARGET, current_a(), SloTargets())
    assert (decision.final_decision, decision.reason_class) == ("DEFER", "slo_missed")
    assert decision.security_boundary_state == "missing"

    everything_wrong = evolve(slow_and_unnoted, {"identity.vllm_version": None, "context.warmup": "unknown"})
    wide = BASE_TARGET.model_copy(update={"concurrency": 64})
    decision = decide(everything_wrong, wide, current_a(), SloTargets())
    assert decision.reason_class == "provenance_incomplete"
    assert (decision.measurement_state, decision.slice_state, decision.service_state) == (
        "warmup_unknown",
        "outside",
        "misses_slo",
    )

    unmeasured_wide = evolve(base_record(), {"context.warmup": "unknown"})
    decision = decide(unmeasured_wide, wide, current_a(), SloTargets())
    assert decision.reason_class == "warmup_unknown"


def test_slo_targets_are_product_choices() -> None:
    record = evolve(base_record(), {"measurements.error_count": 2})
    strict = decide(record, BASE_TARGET, current_a(), SloTargets())
    assert strict.slo_misses == (SloMetric.ERRORS,)
    lenient = decide(record, BASE_TARGET, current_a(), SloTargets(max_errors=2))
    assert lenient.final_decision == "PASS"


def test_no_evidence_defers_and_asks_for_a_measurement() -> None:
    decision = no_evidence()
    assert tuple(v for _, v in decision.fields()) == (
        "no_record",
        "not_measured",
        "not_measured",
        "not_measured",
        "missing",
        "required",
        "DEFER",
        "no_evidence",
    )
    assert isinstance(decision, Decision)
    assert decision.record_id is None
