"""Capacity evidence (docs/evidence.md): records, their store, retest triggers and the decision.

A record binds measurements to the exact configuration and slice they were taken on; the
decision says whether a record backs a lane's target on the configuration in use.
"""

from __future__ import annotations

from router.evidence.boundary import security_boundary_note
from router.evidence.decide import Decision, FinalDecision, ReasonClass, decide, no_evidence
from router.evidence.identity import new_record, pool_identity, serving_configuration
from router.evidence.profile import decide_profile, lane_target, select_record
from router.evidence.records import (
    CapacityEvidenceRecord,
    EvidenceError,
    RecordExistsError,
    ServingConfiguration,
    WarmupState,
)
from router.evidence.store import EvidenceStore, load_records, read_record
from router.evidence.targets import SloTargets, Target
from router.evidence.triggers import RetestTrigger, retest_triggers

__all__ = [
    "CapacityEvidenceRecord",
    "Decision",
    "EvidenceError",
    "EvidenceStore",
    "FinalDecision",
    "ReasonClass",
    "RecordExistsError",
    "RetestTrigger",
    "ServingConfiguration",
    "SloTargets",
    "Target",
    "WarmupState",
    "decide",
    "decide_profile",
    "lane_target",
    "load_records",
    "new_record",
    "no_evidence",
    "pool_identity",
    "read_record",
    "retest_triggers",
    "security_boundary_note",
    "select_record",
    "serving_configuration",
]
