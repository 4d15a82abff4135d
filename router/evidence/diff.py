"""What differs between two records, and which retest triggers that difference fires."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.evidence.records import CapacityEvidenceRecord
from router.evidence.targets import Target
from router.evidence.triggers import RetestTrigger, ordered, retest_triggers


@dataclass(frozen=True, slots=True)
class FieldChange:
    path: str
    before: Any
    after: Any


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path → leaf value of a JSON-like tree."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def changed_fields(a: CapacityEvidenceRecord, b: CapacityEvidenceRecord) -> tuple[FieldChange, ...]:
    """Every content field whose value differs, by dotted path (the id follows from these)."""
    before = flatten(a.model_dump(mode="json", exclude={"record_id"}))
    after = flatten(b.model_dump(mode="json", exclude={"record_id"}))
    paths = sorted(set(before) | set(after))
    return tuple(
        FieldChange(path, before.get(path), after.get(path))
        for path in paths
        if before.get(path) != after.get(path)
    )


def slice_as_target(record: CapacityEvidenceRecord) -> Target:
    measured = record.measured_slice
    return Target(
        max_input_tokens=max(1, measured.input_tokens.max),
        max_output_tokens=max(1, measured.output_tokens.max),
        concurrency=measured.concurrency,
        class_mix=dict(measured.class_mix) or None,
    )


def transfer_triggers(a: CapacityEvidenceRecord, b: CapacityEvidenceRecord) -> tuple[RetestTrigger, ...]:
    """The triggers that fire when `a`'s evidence is offered for `b`'s configuration and slice."""
    return ordered(retest_triggers(a, b.configuration, slice_as_target(b)))
