"""Provenance gaps: absent identity fields, and revisions that name no fixed weights."""

from __future__ import annotations

import pytest

from router.evidence.provenance import GapKind, ProvenanceGap, identity_gaps, is_immutable_revision
from tests.evidence.factories import base_record

COMMIT = "5f1e0c2a9b7d4e3f8a6c1b0d2e4f6a8c9b7d5e3f"
MANIFEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("revision", [COMMIT, MANIFEST])
def test_a_content_hash_is_an_immutable_revision(revision: str) -> None:
    assert is_immutable_revision(revision)


@pytest.mark.parametrize(
    "revision",
    ["main", "v1.0", "refs/pr/3", COMMIT[:7], COMMIT + "0", COMMIT.upper(), "sha256:" + COMMIT, MANIFEST[7:]],
)
def test_names_and_partial_hashes_are_not(revision: str) -> None:
    assert not is_immutable_revision(revision)


def test_gaps_list_absent_fields_then_a_moving_revision() -> None:
    identity = base_record().identity.model_copy(update={"vllm_version": None, "model_revision": "main"})
    assert identity_gaps(identity, "current.") == (
        ProvenanceGap(field="current.vllm_version", kind=GapKind.MISSING),
        ProvenanceGap(field="current.model_revision", kind=GapKind.MOVING_REVISION, value="main"),
    )
    assert identity_gaps(base_record().identity) == ()


def test_each_gap_says_what_is_wrong() -> None:
    missing = ProvenanceGap(field="hardware_profile", kind=GapKind.MISSING)
    assert missing.message == "hardware_profile is missing"
    moving = ProvenanceGap(field="model_revision", kind=GapKind.MOVING_REVISION, value="v1.0")
    assert moving.message == (
        "model_revision 'v1.0' is not an immutable revision (a branch or tag name moves): pin the "
        "full 40-hex commit or sha256:<64 hex> of the weights' manifest"
    )
