from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from router.evidence.records import EvidenceError, RecordExistsError, dump_record
from router.evidence.store import EvidenceStore, load_records, read_record, record_filename
from tests.evidence.factories import base_record, evolve, rehashed

NOBODY = 65534


def test_add_writes_one_file_named_by_the_record_id(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path / "evidence")
    record = base_record()
    path = store.add(record)
    assert path.name == record.record_id.removeprefix("sha256:") + ".json"
    assert path.read_bytes() == dump_record(record)
    assert read_record(path) == record
    assert store.get(record.record_id) == record
    assert [p.name for p in (tmp_path / "evidence").iterdir()] == [path.name]


def test_a_stored_record_is_never_rewritten(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    record = base_record()
    path = store.add(record)
    before = path.stat()
    with pytest.raises(RecordExistsError, match="never rewritten"):
        store.add(record)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_size,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_squatted_name_is_not_overwritten(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    record = base_record()
    squatter = tmp_path / record_filename(record.record_id)
    squatter.write_bytes(b"something else")
    with pytest.raises(RecordExistsError):
        store.add(record)
    assert squatter.read_bytes() == b"something else"
    assert sorted(p.name for p in tmp_path.iterdir()) == [squatter.name]


def test_a_changed_configuration_is_a_new_record_beside_the_old(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    old = base_record()
    changes = {
        "context.knobs.max_num_seqs": 16,
        "measured_at": "2025-06-03T09:30:00Z",
        "supersedes": old.record_id,
    }
    new = rehashed(evolve(old, changes))
    store.add(old)
    store.add(new)
    assert [r.record_id for r in store.records()] == [old.record_id, new.record_id]
    assert list(store) == store.records()


def test_records_are_ordered_by_measurement_time_and_skip_other_files(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    late = evolve(base_record(), {"measured_at": "2025-07-01T00:00:00Z"})
    early = evolve(base_record(), {"measured_at": "2025-01-01T00:00:00Z"})
    store.add(late)
    store.add(early)
    (tmp_path / ".tmp-abandoned.json").write_bytes(b"{")
    (tmp_path / "README.txt").write_text("notes")
    assert [r.record_id for r in store.records()] == [early.record_id, late.record_id]


def test_a_file_under_a_foreign_name_is_refused(tmp_path: Path) -> None:
    record = base_record()
    (tmp_path / "renamed.json").write_bytes(dump_record(record))
    with pytest.raises(EvidenceError, match=r"renamed\.json: file name is not its record's id"):
        EvidenceStore(tmp_path).records()


def test_unreadable_records_name_their_file(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_bytes(b"{not json")
    with pytest.raises(EvidenceError, match=r"broken\.json"):
        EvidenceStore(tmp_path).records()
    with pytest.raises(EvidenceError, match=r"missing\.json"):
        read_record(tmp_path / "missing.json")
    with pytest.raises(EvidenceError, match="nowhere: no such evidence store"):
        EvidenceStore(tmp_path / "nowhere").records()
    with pytest.raises(EvidenceError, match=r"broken\.json: not a directory"):
        EvidenceStore(tmp_path / "broken.json").records()
    with pytest.raises(EvidenceError, match="no record"):
        EvidenceStore(tmp_path).get("sha256:" + "0" * 64)


def test_what_only_looks_like_a_record_is_refused_not_passed_over(tmp_path: Path) -> None:
    EvidenceStore(tmp_path).add(base_record())
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(EvidenceError, match=r"dir\.json: cannot read: Is a directory"):
        EvidenceStore(tmp_path).records()
    (tmp_path / "dir.json").rmdir()
    (tmp_path / "gone.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(EvidenceError, match=r"gone\.json: no such record file"):
        EvidenceStore(tmp_path).records()


def test_a_record_or_store_without_read_permission_is_refused(tmp_path: Path) -> None:
    # Root reads a file whatever its mode, so the reader runs as an unprivileged user then.
    shared = Path(tempfile.mkdtemp(prefix="lane-router-perm-"))
    try:
        shared.chmod(0o755)
        store = EvidenceStore(shared / "evidence")
        store.add(base_record()).chmod(0)
        store.root.chmod(0o755)
        assert "cannot read: Permission denied" in _read_store_unprivileged(store.root)
        store.root.chmod(0)
        assert "evidence: Permission denied" in _read_store_unprivileged(store.root)
    finally:
        (shared / "evidence").chmod(0o700)
        shutil.rmtree(shared)


def _read_store_unprivileged(root: Path) -> str:
    """What reading the store says, from a forked child that gave up root first (it runs the
    modules already loaded, so it needs no access to the interpreter's files)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(reader)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            try:
                EvidenceStore(root).records()
                message = "read"
            except EvidenceError as exc:
                message = str(exc)
            os.write(writer, message.encode())
        finally:
            os._exit(0)
    os.close(writer)
    try:
        with os.fdopen(reader, "rb") as answer:
            said = answer.read().decode()
    finally:
        os.waitpid(pid, 0)
    return said


def test_concurrent_writers_of_one_record_leave_exactly_one_file(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    record = base_record()
    start = threading.Barrier(4)
    outcomes: list[str] = []
    lock = threading.Lock()

    def write() -> None:
        start.wait()
        try:
            store.add(record)
            result = "stored"
        except RecordExistsError:
            result = "refused"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["refused", "refused", "refused", "stored"]
    assert [p.name for p in tmp_path.iterdir()] == [record_filename(record.record_id)]
    assert store.records() == [record]


def test_load_records_reads_a_file_or_a_directory(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    path = store.add(base_record())
    assert load_records(path) == [base_record()]
    assert load_records(tmp_path) == [base_record()]
