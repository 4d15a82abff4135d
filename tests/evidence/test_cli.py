from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import yaml

from router.cli import main
from router.evidence.store import EvidenceStore
from tests.evidence.bad_evidence import CASES, RECORD_CASES, BadEvidence, assert_refused
from tests.evidence.factories import (
    base_record,
    config_a,
    config_b,
    evolve,
    example_profile_data,
    measured,
    rehashed,
)


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


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        *(("--slo", slo, "--slo") for slo in ("p95_ttft_ms", "latency=3", "max_errors=-1", "max_errors=x")),
        ("--class-mix", "chat", "--class-mix 'chat': expected CLASS=SHARE"),
        ("--class-mix", "chat=x", "--class-mix 'chat=x': expected CLASS=SHARE"),
        ("--class-mix", "poetry=1", "--class-mix 'poetry=1': expected CLASS=SHARE, CLASS one of chat,"),
        ("--class-mix", "chat=0.5,chat=0.5", "--class-mix: chat is given twice"),
        ("--class-mix", "chat=0.5,rag=0.4", "--class-mix: shares must add up to 1"),
        ("--class-mix", "chat=1.5", "--class-mix: share of 'chat' must be in (0, 1]"),
        ("--class-mix", "chat=nan", "--class-mix: share of 'chat' must be in (0, 1]"),
    ],
)
def test_decide_refuses_a_bad_option_with_exit_2_in_one_line(
    option: str,
    value: str,
    problem: str,
    store: EvidenceStore,
    profiles: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = store.add(base_record())
    assert main(_decide(path, profiles[0], option, value)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lane-router evidence: {problem}")
    assert len(err.splitlines()) == 1


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
    b = rehashed(evolve(a, {"context.knobs.max_num_seqs": 16, "measured_slice.concurrency": 16}))
    pa, pb = store.add(a), store.add(b)
    assert main(["evidence", "diff", str(pa), str(pb)]) == 1
    out = capsys.readouterr().out.splitlines()
    changed = {line.split()[0]: line.split()[1:] for line in out[1:-1]}
    assert changed == {
        "context.knobs.max_num_seqs": ["8", "16"],
        "identity.server_configuration_hash": [
            a.identity.server_configuration_hash,
            b.identity.server_configuration_hash,
        ],
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


@pytest.mark.parametrize("build", CASES.values(), ids=CASES.keys())
def test_show_refuses_an_unusable_store_with_exit_2(
    build: Callable[[Path], BadEvidence], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = build(tmp_path)
    assert main(["evidence", "show", str(bad.store)]) == 2
    assert_refused(capsys.readouterr().err, bad, "evidence")


@pytest.mark.parametrize("build", RECORD_CASES.values(), ids=RECORD_CASES.keys())
def test_decide_refuses_an_unusable_record_with_exit_2_not_a_decision(
    build: Callable[[Path], BadEvidence],
    tmp_path: Path,
    profiles: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = build(tmp_path)
    assert main(_decide(bad.record, profiles[0])) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_refused(err, bad, "evidence")


@pytest.mark.parametrize("build", RECORD_CASES.values(), ids=RECORD_CASES.keys())
def test_diff_refuses_an_unusable_record_on_either_side_with_exit_2(
    build: Callable[[Path], BadEvidence], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = build(tmp_path)
    good = EvidenceStore(tmp_path / "good").add(base_record())
    for pair in ((good, bad.record), (bad.record, good)):
        assert main(["evidence", "diff", str(pair[0]), str(pair[1])]) == 2
        assert_refused(capsys.readouterr().err, bad, "evidence")


def _on_revision(tmp_path: Path, revision: str) -> tuple[Path, Path]:
    """A record of config A's chat slice and config A's profile, both at `revision`."""
    settings = config_a().model_copy(update={"model_revision": revision})
    record = EvidenceStore(tmp_path / "evidence").add(measured(settings))
    profile = tmp_path / "profile.yaml"
    data = example_profile_data(settings, max_in_flight=8, max_prompt=2048, max_output=512)
    profile.write_text(yaml.safe_dump(data))
    return record, profile


@pytest.mark.parametrize("revision", ["main", "v1.0", "5f1e0c2"])
def test_decide_defers_a_revision_that_is_no_content_hash_and_says_so(
    revision: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record, profile = _on_revision(tmp_path, revision)
    assert main(_decide(record, profile)) == 3
    table = _table(capsys.readouterr().out)
    assert (table["provenance_state"], table["reason_class"]) == ("incomplete", "provenance_incomplete")
    gaps = table["provenance_gaps"].split("; ")
    assert [gap.split(" ", 1)[0] for gap in gaps] == ["model_revision", "current.model_revision"]
    assert all(
        f"{revision!r} is not an immutable revision (a branch or tag name moves)" in gap for gap in gaps
    )


@pytest.mark.parametrize("revision", ["0123456789abcdef0123456789abcdef01234567", "sha256:" + "ab" * 32])
def test_decide_passes_a_revision_pinned_by_content(
    revision: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record, profile = _on_revision(tmp_path, revision)
    assert main(_decide(record, profile)) == 0
    assert _table(capsys.readouterr().out)["provenance_gaps"] == "-"


@pytest.mark.parametrize(
    ("mix", "code", "triggers"),
    [
        ("chat=1", 0, "-"),
        ("chat=0.5,rag=0.5", 3, "class_mix"),
        ("chat=0.95,rag=0.05", 3, "class_mix"),  # rag was never measured, however small its share
    ],
)
def test_decide_holds_the_record_to_a_stated_class_mix(
    mix: str,
    code: int,
    triggers: str,
    store: EvidenceStore,
    profiles: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = store.add(base_record())  # measured chat only
    assert main(_decide(path, profiles[0], "--class-mix", mix)) == code
    table = _table(capsys.readouterr().out)
    assert table["triggers"] == triggers
    assert table["target"].endswith(" mix " + mix)


def test_a_mix_within_the_tolerance_of_the_measured_one_is_covered(
    store: EvidenceStore, profiles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    mixed = {"measured_slice.class_mix": {"chat": 0.6, "rag": 0.4}}
    path = store.add(evolve(base_record(), mixed))
    assert main(_decide(path, profiles[0], "--class-mix", "chat=0.65,rag=0.35")) == 0
    capsys.readouterr()
    assert main(_decide(path, profiles[0], "--class-mix", "chat=0.8,rag=0.2")) == 3
    assert _table(capsys.readouterr().out)["triggers"] == "class_mix"


def test_decide_takes_any_models_lane_by_name(
    store: EvidenceStore, profiles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = store.add(base_record())
    data = yaml.safe_load(profiles[0].read_text())
    data["pools"]["embed"] = {"backends": ["http://127.0.0.1:8102"], "model": "bge"}
    profiles[0].write_text(yaml.safe_dump(data))
    decide_on = ["evidence", "decide", "--record", str(path), "--config", str(profiles[0]), "--lane"]

    assert main([*decide_on, "chat"]) == 0
    assert main([*decide_on, "bge:chat"]) == 3  # the record measured another model's servers
    capsys.readouterr()
    assert main([*decide_on, "mistral:chat"]) == 2
    err = capsys.readouterr().err
    assert (
        "no lane 'mistral:chat' in the profile (lanes: " in err and "bge:chat, " in err and " chat, " in err
    )
