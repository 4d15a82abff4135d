"""Reading a record: every check its bytes must pass before anything trusts them.

A record is refused, with one line naming its source and the problem, when it is empty, not
JSON, not an object, of a version this router does not read, without its `record_id`, has a
value of the wrong type (strictly: `"8"` is not 8, `1` is not `true`), states an id that is not
the hash of its content, or states a configuration hash that its own knobs, vLLM version, model
revision and served model do not hash to. The id makes any edit show; the configuration hash
check makes a record whose id was recomputed after its knobs were edited show too.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from router.evidence.identity import knobs_hash
from router.evidence.records import RECORD_VERSION, CapacityEvidenceRecord, EvidenceError


def parse_record(data: bytes | str, source: str = "<record>") -> CapacityEvidenceRecord:
    """The record in `data`, checked; `EvidenceError` naming `source` and the problem if unusable."""
    raw = _json_object(data, source)
    _check_version(raw, source)
    stated = _stated_id(raw, source)
    try:
        record = CapacityEvidenceRecord.model_validate_json(orjson.dumps(raw), strict=True)
    except ValidationError as exc:
        raise EvidenceError(f"{source}: invalid record: {validation_problems(exc)}") from None
    if stated != record.record_id:
        raise EvidenceError(
            f"{source}: record_id {stated} does not match its content ({record.record_id}): "
            "the record was changed after it was written"
        )
    _check_configuration_hash(record, source)
    return record


def validation_problems(exc: ValidationError) -> str:
    """Every problem of `exc` on one line: `dotted.path: message (got value)`."""
    return "; ".join(_problem(error) for error in exc.errors())


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "value"
    value = error.get("input")
    # Only a plain value says something; the input of a missing field is its whole parent.
    got = f" (got {value!r})" if isinstance(value, str | int | float) else ""
    return f"{where}: {error['msg']}{got}"


def _json_object(data: bytes | str, source: str) -> dict[str, Any]:
    if not data.strip():
        raise EvidenceError(f"{source}: empty file, not a record")
    try:
        raw: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EvidenceError(f"{source}: not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise EvidenceError(f"{source}: a record is a JSON object, not {type(raw).__name__}")
    return raw


def _check_version(raw: dict[str, Any], source: str) -> None:
    version = raw.get("record_version", RECORD_VERSION)
    # `type` rather than `==`: `true` and `1.0` equal 1 but are not the version number.
    if type(version) is not int or version != RECORD_VERSION:
        raise EvidenceError(
            f"{source}: record_version {version!r} is unknown: this router reads version "
            f"{RECORD_VERSION} records"
        )


def _stated_id(raw: dict[str, Any], source: str) -> str:
    stated = raw.pop("record_id", None)
    if stated is None:
        raise EvidenceError(
            f"{source}: no record_id: a record states the sha256 of its content, so that an edit "
            "shows; one without it cannot be trusted"
        )
    if not isinstance(stated, str):
        raise EvidenceError(f"{source}: record_id must be a string, got {stated!r}")
    return stated


def _check_configuration_hash(record: CapacityEvidenceRecord, source: str) -> None:
    identity = record.identity
    stated = identity.server_configuration_hash
    if stated is None or identity.vllm_version is None:
        # Nothing to hold the knobs against; the decision says provenance_incomplete, never PASS.
        return
    try:
        computed = knobs_hash(record.configuration)
    except ValidationError as exc:
        raise EvidenceError(
            f"{source}: context.knobs are no vLLM configuration: {validation_problems(exc)}"
        ) from None
    if computed != stated:
        raise EvidenceError(
            f"{source}: identity.server_configuration_hash {stated} is not the hash of the record's "
            f"own knobs, vLLM version, model revision and served model ({computed}): the record "
            "is inconsistent"
        )
