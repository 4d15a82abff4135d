"""Evidence stores made unusable by hand, one way each, for the commands that must refuse them.

Each case builds, under a fresh directory, a store of config A's chat record (tests/evidence/
factories.py) with one thing wrong, and says which path the refusal must name and what it must
say about it. A tampered record starts from a measurement that misses the SLO and is edited to
pass, as someone hiding a failure would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from router.evidence.records import dump_record
from router.evidence.store import record_filename
from tests.evidence.factories import DELETE, base_record, edited, evolve

FAILING_P95_TTFT_MS = 2400.0
PASSING_P95_TTFT_MS = 800.0


@dataclass(frozen=True, slots=True)
class BadEvidence:
    store: Path  # what `check --evidence` and `serve --require-evidence` are given
    record: Path  # the unusable path the refusal names (what `evidence decide --record` is given)
    problem: str  # what the refusal says about it


def missing_store(root: Path) -> BadEvidence:
    store = root / "nowhere"
    return BadEvidence(store, store, "no such record file")


def _filed(root: Path, content: bytes, name: str | None = None) -> BadEvidence:
    """`content` as the one file of a store, under `name` or else under the id it states."""
    store = root / "evidence"
    store.mkdir()
    path = store / (name or record_filename(orjson.loads(content)["record_id"]))
    path.write_bytes(content)
    return BadEvidence(store, path, "")


def _with_problem(case: BadEvidence, problem: str) -> BadEvidence:
    return BadEvidence(case.store, case.record, problem)


def not_json(root: Path) -> BadEvidence:
    return _with_problem(_filed(root, b"\xff{ not json", "broken.json"), "not JSON")


def empty_file(root: Path) -> BadEvidence:
    return _with_problem(_filed(root, b"", "empty.json"), "empty file, not a record")


def directory_as_record(root: Path) -> BadEvidence:
    store = root / "evidence"
    path = store / "dir.json"
    path.mkdir(parents=True)
    return BadEvidence(store, path, "cannot read")


def _failing_edited(changes: dict[str, Any], *, restate_id: bool = False) -> bytes:
    failing = evolve(base_record(), {"measurements.ttft.p95_ms": FAILING_P95_TTFT_MS})
    return edited(failing, changes, restate_id=restate_id)


def tampered(root: Path) -> BadEvidence:
    content = _failing_edited({"measurements.ttft.p95_ms": PASSING_P95_TTFT_MS})
    return _with_problem(_filed(root, content), "does not match its content")


def id_removed(root: Path) -> BadEvidence:
    failing = evolve(base_record(), {"measurements.ttft.p95_ms": FAILING_P95_TTFT_MS})
    content = edited(failing, {"measurements.ttft.p95_ms": PASSING_P95_TTFT_MS, "record_id": DELETE})
    return _with_problem(_filed(root, content, record_filename(failing.record_id)), "no record_id")


def unknown_version(root: Path) -> BadEvidence:
    content = edited(base_record(), {"record_version": 2}, restate_id=True)
    return _with_problem(_filed(root, content), "record_version 2 is unknown")


def coerced_type(root: Path) -> BadEvidence:
    content = edited(base_record(), {"context.knobs.max_num_seqs": "8"}, restate_id=True)
    return _with_problem(_filed(root, content), "context.knobs.max_num_seqs: Input should be a valid integer")


def knobs_disagree_with_hash(root: Path) -> BadEvidence:
    content = edited(base_record(), {"context.knobs.max_num_seqs": 16}, restate_id=True)
    return _with_problem(_filed(root, content), "is not the hash of the record's own knobs")


def misnamed(root: Path) -> BadEvidence:
    case = _filed(root, dump_record(base_record()), "renamed.json")
    return _with_problem(case, "file name is not its record's id")


CASES: dict[str, Callable[[Path], BadEvidence]] = {
    "missing store": missing_store,
    "not JSON": not_json,
    "empty file": empty_file,
    "directory as record": directory_as_record,
    "tampered": tampered,
    "record_id removed": id_removed,
    "unknown version": unknown_version,
    "coerced type": coerced_type,
    "knobs disagree with hash": knobs_disagree_with_hash,
    "misnamed": misnamed,
}
# A record file outside a store may have any name; every other case is unusable on its own too.
RECORD_CASES = {name: build for name, build in CASES.items() if build is not misnamed}


def assert_refused(err: str, case: BadEvidence, command: str) -> None:
    """One line on stderr, no traceback, naming the unusable path and what is wrong with it."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"lane-router {command}: {case.record}: "), lines[0]
    assert case.problem in lines[0]
