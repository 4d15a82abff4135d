"""Provenance gaps: what keeps a configuration identity from naming exactly one server.

An identity field may be absent, and a model revision may name something that moves: a branch or
a tag (`main`, `v1.0`) points at other weights as it is updated, so evidence measured under it
says nothing certain about the weights served today. Only a content hash pins the weights: a full
40-hex git commit, or `sha256:<64 hex>` of the weights' manifest.
"""

from __future__ import annotations

import re
from enum import StrEnum

from router.evidence.records import Frozen, Identity

IMMUTABLE_REVISION = re.compile(r"[0-9a-f]{40}|sha256:[0-9a-f]{64}")


class GapKind(StrEnum):
    MISSING = "missing"
    MOVING_REVISION = "moving_revision"


class ProvenanceGap(Frozen):
    """One reason the identity is incomplete: `field` (`current.` for the configuration in use)."""

    field: str
    kind: GapKind
    value: str | None = None

    @property
    def message(self) -> str:
        if self.kind is GapKind.MISSING:
            return f"{self.field} is missing"
        return (
            f"{self.field} {self.value!r} is not an immutable revision (a branch or tag name moves): "
            "pin the full 40-hex commit or sha256:<64 hex> of the weights' manifest"
        )


def is_immutable_revision(revision: str) -> bool:
    return IMMUTABLE_REVISION.fullmatch(revision) is not None


def identity_gaps(identity: Identity, prefix: str = "") -> tuple[ProvenanceGap, ...]:
    """The identity's absent fields, then a revision that is present but not a content hash."""
    gaps = [ProvenanceGap(field=prefix + name, kind=GapKind.MISSING) for name in identity.missing()]
    revision = identity.model_revision
    if revision and revision.strip() and not is_immutable_revision(revision):
        gaps.append(
            ProvenanceGap(field=prefix + "model_revision", kind=GapKind.MOVING_REVISION, value=revision)
        )
    return tuple(gaps)
