"""A directory of evidence records: append-only, one file per record, never rewritten.

A record is written to a temporary file in the same directory, flushed to disk, then hard-linked
to its final name. `link` refuses an existing name atomically — the rename that cannot
overwrite — so two writers of the same record cannot clobber each other, and a reader never
sees a half-written file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from router.evidence.reading import parse_record
from router.evidence.records import CapacityEvidenceRecord, EvidenceError, RecordExistsError, dump_record

SUFFIX = ".json"
TEMP_PREFIX = ".tmp-"


def record_filename(record_id: str) -> str:
    return record_id.removeprefix("sha256:") + SUFFIX


def read_record(path: str | Path) -> CapacityEvidenceRecord:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise EvidenceError(f"{path}: no such record file") from None
    except OSError as exc:
        raise EvidenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_record(data, str(path))


class EvidenceStore:
    """The records under one directory; iterating reads them all, oldest measurement first."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path_for(self, record: CapacityEvidenceRecord) -> Path:
        return self.root / record_filename(record.record_id)

    def add(self, record: CapacityEvidenceRecord) -> Path:
        """Store a new record; `RecordExistsError` if its file is already there."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path_for(record)
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=TEMP_PREFIX, suffix=SUFFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(dump_record(record))
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(temp, final)
            except FileExistsError:
                raise RecordExistsError(
                    f"{final}: record {record.record_id} is already stored; records are never "
                    "rewritten (a changed configuration or measurement is a new record)"
                ) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        _sync_directory(self.root)
        return final

    def paths(self) -> list[Path]:
        if not self.root.exists():
            raise EvidenceError(f"{self.root}: no such evidence store")
        if not self.root.is_dir():
            raise EvidenceError(f"{self.root}: not a directory, so not an evidence store")
        try:
            # Every visible *.json is a record, whatever it is: a directory or a dangling link
            # under a record's name is refused when read, not passed over.
            return sorted(p for p in self.root.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))
        except OSError as exc:
            raise EvidenceError(f"{self.root}: {exc.strerror or exc}") from None

    def records(self) -> list[CapacityEvidenceRecord]:
        found = [_named_by_id(path, read_record(path)) for path in self.paths()]
        return sorted(found, key=lambda r: (r.measured_at, r.record_id))

    def get(self, record_id: str) -> CapacityEvidenceRecord:
        path = self.root / record_filename(record_id)
        if not path.is_file():
            raise EvidenceError(f"{self.root}: no record {record_id}")
        return read_record(path)

    def __iter__(self) -> Iterator[CapacityEvidenceRecord]:
        return iter(self.records())


def load_records(path: str | Path) -> list[CapacityEvidenceRecord]:
    """One record file, or every record of a store directory."""
    path = Path(path)
    if path.is_dir():
        return EvidenceStore(path).records()
    if not path.exists():
        raise EvidenceError(f"{path}: no such record file or evidence store")
    return [read_record(path)]


def _named_by_id(path: Path, record: CapacityEvidenceRecord) -> CapacityEvidenceRecord:
    # In a store the file name is the id, so a record cannot hide behind another's name.
    if path.name != record_filename(record.record_id):
        raise EvidenceError(
            f"{path}: file name is not its record's id ({record_filename(record.record_id)}); "
            "a store files each record under its id"
        )
    return record


def _sync_directory(root: Path) -> None:
    # Makes the new name itself durable, not only the file's bytes.
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
