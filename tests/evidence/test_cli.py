from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from router.cli import main
from router.evidence.store import EvidenceStore
from tests.evidence.factories import base_record, config_a, config_b, evolve, example_profile_data


@pytest.fixture
def profiles(tmp_path: Path) -> tuple[Path, Path]:
    a = tmp_path / "a.yaml"
    a.write_text(
        yaml.safe_dump(example_profile_data(config_a(), max_in_flight=8, max_prompt=2048, max_output=512))
    )
    b = tmp_path / "b.yaml"
    b.write_text(
        yaml.safe_dump(example_profile_data(config_b(), max_in_flight=12, max_prompt=4096, max_output=1024))
    )
    return a, b


@pytest.fixture
def store(tmp_path: Path) -> EvidenceStore:
    return EvidenceStore(tmp_path / "evidence")


def _table(out: str) -> dict[str, str]:
    rows = (line.split(None, 1) for line in out.splitlines()[1:])
    return {row[0]: row[1] if len(row) > 1 else "" for row in rows}


def test_show_lists_every_record_of_a_store(store: EvidenceStore, capsys: pytest.CaptureFixture[str]) -> None:
    first = base_record()
    second = evolve(
        first,
        {
            "measured_at": "2025-06-05T00:00:00Z",
            "security_boundary_note": None,
            "supersedes": first.record_id,
        },
    )
    store.add(first)
    store.add(second)
    assert main(["evidence", "show", str(store.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["record", "measured_at", "model", "config"]
    assert [line.split()[0] for line in lines[1:]] == [first.record_id[7:19], second.record_id[7:19]]
    assert "in≤2048 out≤512 c≤8" in lines[1]
    assert lines[1].split()[-2:] == ["yes", "-"]
    assert lines[2].split()[-2:] == ["no", first.record_id[7:19]]


def test_show_json_prints_the_records_as_stored(
    store: EvidenceStore, capsys: pytest.CaptureFixture[str]
) -> None:
    path = store.add(base_record())
    assert main(["evidence", "show", "--json", str(path)]) == 0
    assert orjson.loads(capsys.readouterr().out)["record_id"] == base_record().record_id


def test_show_an_unreadable_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evidence", "show", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err


def _decide(record: Path, profile: Path, *extra: str) -> list[str]:
    return ["evidence", "decide", "--record", str(record), "--config", str(profile), "--lane", "chat", *extra]


def test_decide_prints_the_eight_fields_and_exits_0_on_pass(
    store: EvidenceStore, profiles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = store.add(base_record())
    assert main(_decide(path, profiles[0])) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()[1:9]]
    assert names == [
        "provenance_state",
        "measurement_state",
        "slice_state",
        "service_state",
        "security_boundary_state",
        "retest_state",
        "final_decision",
        "reason_class",
    ]
    table = _table(out)
    assert (table["final_decision"], table["reason_class"]) == ("PASS", "within_measured_evidence")
    assert table["target"] == "in≤2048 out≤512 concurrency 8"


def test_decide_exits_1_when_conditional(
    store: EvidenceStore, profiles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = store.add(evolve(base_record(), {"security_boundary_note": None}))
    assert main(_decide(path, profiles[0])) == 1
    assert _table(capsys.readouterr().out)["final_decision"] == "CONDITIONAL"


def test_decide_exits_3_on_defer_and_names_the_triggers(
    store: EvidenceStore, profiles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = store.add(base_record())
    assert main(_decide(path, profiles[1])) == 3
    table = _table(capsys.readouterr().out)
    assert table["reason_class"] == "configuration_changed"
    assert table["triggers"] == ("config_hash, parallelism, max_model_len, request_shape, concurrency")


def test_decide_target_and_slo_overrides(
    store: EvidenceStore, profiles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = store.add(base_record())
    assert main(_decide(path, profiles[0], "--concurrency", "4", "--max-input", "1024")) == 0
    assert _table(capsys.readouterr().out)["target"] == "in≤1024 out≤512 concurrency 4"
    assert main(_decide(path, profiles[0], "--concurrency", "9")) == 3
    assert _table(capsys.readouterr().out)["triggers"] == "concurrency"
    assert main(_decide(path, profiles[0], "--slo", "p95_ttft_ms=500")) == 3
    assert _table(capsys.readouterr().out)["slo_misses"] == "p95_ttft"
    slow = store.add(evolve(base_record(), {"measurements.ttft.p95_ms": 5000.0}))
    assert main(_decide(slow, profiles[0], "--slo", "p95_ttft_ms=none")) == 0


@pytest.mark.parametrize("slo", ["p95_ttft_ms", "latency=3", "max_errors=-1", "max_errors=x"])
def test_decide_refuses_a_bad_slo_with_exit_2(
    slo: str,
    store: EvidenceStore,
    profiles: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = store.add(base_record())
    assert main(_decide(path, profiles[0], "--slo", slo)) == 2
    assert "--slo" in capsys.readouterr().err


def test_decide_refuses_unreadable_inputs_with_exit_2(
    tmp_path: Path,
    store: EvidenceStore,
    profiles: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = store.add(base_record())
    assert main(_decide(tmp_path / "none.json", profiles[0])) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {}\n")
    assert main(_decide(path, bad)) == 2
    assert "bad.yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(_decide(path, profiles[0], "--concurrency", "0"))
    assert exc.value.code == 2


def test_diff_lists_changed_fields_and_fired_triggers(
    store: EvidenceStore, capsys: pytest.CaptureFixture[str]
) -> None:
    a = base_record()
    b = evolve(
        a,
        {
            "context.knobs.max_num_seqs": 16,
            "measured_slice.concurrency": 16,
            "identity.server_configuration_hash": "sha256:" + "3" * 64,
        },
    )
    pa, pb = store.add(a), store.add(b)
    assert main(["evidence", "diff", str(pa), str(pb)]) == 1
    out = capsys.readouterr().out.splitlines()
    changed = {line.split()[0]: line.split()[1:] for line in out[1:-1]}
    assert changed == {
        "context.knobs.max_num_seqs": ["8", "16"],
        "identity.server_configuration_hash": [a.identity.server_configuration_hash, "sha256:" + "3" * 64],
        "measured_slice.concurrency": ["8", "16"],
    }
    assert out[-1] == ("retest triggers (A's evidence for B): config_hash, batching_limits, concurrency")


def test_diff_of_a_record_with_itself_is_empty(
    store: EvidenceStore, capsys: pytest.CaptureFixture[str]
) -> None:
    path = store.add(base_record())
    assert main(["evidence", "diff", str(path), str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "no field differs",
        "retest triggers (A's evidence for B): none",
    ]
