"""The evidence decision: may this record back this target on this configuration?

Every state is computed and reported; the final decision follows the first gate that fails, in
the order provenance → measurement → slice → SLO → security boundary. Only the boundary gate
yields CONDITIONAL: performance that passes with no boundary note is not a benchmark failure,
but it is not a plain PASS either. Reasons are enums, never prose to be matched.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from router.evidence.provenance import GapKind, ProvenanceGap, identity_gaps
from router.evidence.records import (
    CapacityEvidenceRecord,
    Frozen,
    ServingConfiguration,
    WarmupState,
)
from router.evidence.targets import SloMetric, SloTargets, Target, slo_misses
from router.evidence.triggers import (
    CONFIGURATION_TRIGGERS,
    SLICE_TRIGGERS,
    RetestTrigger,
    ordered,
    retest_triggers,
)

# Below this many requests a p95 is just the slowest request, so the protocol cannot show one.
MIN_SAMPLES = 20


class ProvenanceState(StrEnum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    MISMATCH = "mismatch"
    NO_RECORD = "no_record"


class MeasurementState(StrEnum):
    QUALIFIED = "qualified"
    WARMUP_UNKNOWN = "warmup_unknown"
    PROTOCOL_INCOMPLETE = "protocol_incomplete"
    TOO_FEW_SAMPLES = "too_few_samples"
    NOT_MEASURED = "not_measured"


class SliceState(StrEnum):
    INSIDE = "inside"
    OUTSIDE = "outside"
    NOT_MEASURED = "not_measured"


class ServiceState(StrEnum):
    MEETS_SLO = "meets_slo"
    MISSES_SLO = "misses_slo"
    NOT_MEASURED = "not_measured"


class BoundaryState(StrEnum):
    DOCUMENTED = "documented"
    MISSING = "missing"


class RetestState(StrEnum):
    NOT_REQUIRED = "not_required"
    REQUIRED = "required"


class FinalDecision(StrEnum):
    PASS = "PASS"
    CONDITIONAL = "CONDITIONAL"
    DEFER = "DEFER"


class ReasonClass(StrEnum):
    WITHIN_MEASURED_EVIDENCE = "within_measured_evidence"
    NO_EVIDENCE = "no_evidence"
    PROVENANCE_INCOMPLETE = "provenance_incomplete"
    CONFIGURATION_CHANGED = "configuration_changed"
    WARMUP_UNKNOWN = "warmup_unknown"
    PROTOCOL_INCOMPLETE = "protocol_incomplete"
    TOO_FEW_SAMPLES = "too_few_samples"
    OUTSIDE_MEASURED_SLICE = "outside_measured_slice"
    SLO_MISSED = "slo_missed"
    BOUNDARY_NOTE_MISSING = "boundary_note_missing"


DECISION_FIELDS: tuple[str, ...] = (
    "provenance_state",
    "measurement_state",
    "slice_state",
    "service_state",
    "security_boundary_state",
    "retest_state",
    "final_decision",
    "reason_class",
)


class Decision(Frozen):
    provenance_state: ProvenanceState
    measurement_state: MeasurementState
    slice_state: SliceState
    service_state: ServiceState
    security_boundary_state: BoundaryState
    retest_state: RetestState
    final_decision: FinalDecision
    reason_class: ReasonClass
    # The detail behind the states: which record, which triggers fired, which SLO bounds missed,
    # what keeps the provenance from being complete.
    record_id: str | None = None
    triggers: tuple[RetestTrigger, ...] = ()
    slo_misses: tuple[SloMetric, ...] = ()
    provenance_gaps: tuple[ProvenanceGap, ...] = ()

    @property
    def missing_identity(self) -> tuple[str, ...]:
        """The identity fields that are absent (`current.` ones of the configuration in use)."""
        return tuple(gap.field for gap in self.provenance_gaps if gap.kind is GapKind.MISSING)

    def fields(self) -> tuple[tuple[str, str], ...]:
        """The eight decision fields, in order, as (name, value)."""
        return tuple((name, str(getattr(self, name))) for name in DECISION_FIELDS)


def decide(
    record: CapacityEvidenceRecord,
    target: Target,
    current: ServingConfiguration,
    slo: SloTargets,
) -> Decision:
    fired = retest_triggers(record, current, target)
    gaps = identity_gaps(record.identity) + identity_gaps(current.identity, "current.")
    misses = slo_misses(record.measurements, slo)
    provenance = _provenance(gaps, fired)
    measurement = _measurement(record)
    slice_state = SliceState.OUTSIDE if fired & SLICE_TRIGGERS else SliceState.INSIDE
    service = ServiceState.MISSES_SLO if misses else ServiceState.MEETS_SLO
    note = record.security_boundary_note
    boundary = BoundaryState.DOCUMENTED if note and note.strip() else BoundaryState.MISSING
    needs_retest = (
        bool(fired)
        or provenance is not ProvenanceState.COMPLETE
        or measurement is not MeasurementState.QUALIFIED
    )
    final, reason = _verdict(provenance, measurement, slice_state, service, boundary)
    return Decision(
        provenance_state=provenance,
        measurement_state=measurement,
        slice_state=slice_state,
        service_state=service,
        security_boundary_state=boundary,
        retest_state=RetestState.REQUIRED if needs_retest else RetestState.NOT_REQUIRED,
        final_decision=final,
        reason_class=reason,
        record_id=record.record_id,
        triggers=ordered(fired),
        slo_misses=misses,
        provenance_gaps=gaps,
    )


def no_evidence() -> Decision:
    """The decision for a configuration no record speaks about: measure it first."""
    return Decision(
        provenance_state=ProvenanceState.NO_RECORD,
        measurement_state=MeasurementState.NOT_MEASURED,
        slice_state=SliceState.NOT_MEASURED,
        service_state=ServiceState.NOT_MEASURED,
        security_boundary_state=BoundaryState.MISSING,
        retest_state=RetestState.REQUIRED,
        final_decision=FinalDecision.DEFER,
        reason_class=ReasonClass.NO_EVIDENCE,
    )


def _provenance(gaps: tuple[ProvenanceGap, ...], fired: frozenset[RetestTrigger]) -> ProvenanceState:
    if gaps:
        return ProvenanceState.INCOMPLETE
    if fired & CONFIGURATION_TRIGGERS:
        return ProvenanceState.MISMATCH
    return ProvenanceState.COMPLETE


def _measurement(record: CapacityEvidenceRecord) -> MeasurementState:
    context = record.context
    protocol = context.protocol
    if context.warmup is WarmupState.UNKNOWN:
        return MeasurementState.WARMUP_UNKNOWN
    if not protocol.tool.strip() or protocol.workload_sha256 is None or protocol.duration_s <= 0:
        return MeasurementState.PROTOCOL_INCOMPLETE
    if protocol.sample_count < MIN_SAMPLES:
        return MeasurementState.TOO_FEW_SAMPLES
    return MeasurementState.QUALIFIED


_MEASUREMENT_REASONS: Mapping[MeasurementState, ReasonClass] = MappingProxyType(
    {
        MeasurementState.WARMUP_UNKNOWN: ReasonClass.WARMUP_UNKNOWN,
        MeasurementState.PROTOCOL_INCOMPLETE: ReasonClass.PROTOCOL_INCOMPLETE,
        MeasurementState.TOO_FEW_SAMPLES: ReasonClass.TOO_FEW_SAMPLES,
    }
)


def _verdict(
    provenance: ProvenanceState,
    measurement: MeasurementState,
    slice_state: SliceState,
    service: ServiceState,
    boundary: BoundaryState,
) -> tuple[FinalDecision, ReasonClass]:
    if provenance is ProvenanceState.INCOMPLETE:
        return FinalDecision.DEFER, ReasonClass.PROVENANCE_INCOMPLETE
    if provenance is ProvenanceState.MISMATCH:
        return FinalDecision.DEFER, ReasonClass.CONFIGURATION_CHANGED
    if measurement in _MEASUREMENT_REASONS:
        return FinalDecision.DEFER, _MEASUREMENT_REASONS[measurement]
    if slice_state is SliceState.OUTSIDE:
        return FinalDecision.DEFER, ReasonClass.OUTSIDE_MEASURED_SLICE
    if service is ServiceState.MISSES_SLO:
        return FinalDecision.DEFER, ReasonClass.SLO_MISSED
    if boundary is BoundaryState.MISSING:
        return FinalDecision.CONDITIONAL, ReasonClass.BOUNDARY_NOTE_MISSING
    return FinalDecision.PASS, ReasonClass.WITHIN_MEASURED_EVIDENCE
