"""`check --evidence` and `serve --require-evidence`: evidence gating a whole profile."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from router.cli import main
from router.config.models import RequestClass
from router.config.vllm import VllmSettings
from router.evidence.store import EvidenceStore
from tests.evidence.bad_evidence import CASES, BadEvidence, assert_refused, tampered
from tests.evidence.factories import config_a, config_b, example_profile_data, measured, record_a


def _write_profile(tmp_path: Path, settings: VllmSettings, in_flight: int) -> Path:
    data = example_profile_data(settings, max_in_flight=in_flight, max_prompt=2048, max_output=512)
    lanes = data["lanes"]
    assert isinstance(lanes, dict)
    # Every lane carries the chat lane's limits, so config A's one record covers them all.
    for lane in lanes.values():
        lane.update({"max_in_flight": in_flight, "max_prompt_tokens": 2048, "max_output_tokens": 512})
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def store(tmp_path: Path) -> Path:
    directory = tmp_path / "evidence"
    EvidenceStore(directory).add(record_a())
    return directory


def test_check_prints_a_pass_per_lane_for_the_measured_configuration(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _write_profile(tmp_path, config_a(), 8)
    assert main(["check", str(profile), "--evidence", str(store)]) == 0
    out = capsys.readouterr().out
    evidence = out.split("evidence:")[1]
    assert evidence.count(" PASS ") == 6
    assert "DEFER" not in evidence


def test_check_defers_a_changed_configuration_and_names_the_triggers(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _write_profile(tmp_path, config_b(), 8)
    assert main(["check", str(profile), "--evidence", str(store)]) == 3  # as `evidence decide` exits
    evidence = capsys.readouterr().out.split("evidence:")[1]
    assert evidence.count(" DEFER ") == 6
    assert "config_hash" in evidence and "parallelism" in evidence


def test_serve_refuses_to_start_without_passing_evidence(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _write_profile(tmp_path, config_a(), 12)  # more concurrency than was measured
    code = main(["serve", "--config", str(profile), "--require-evidence", str(store)])
    err = capsys.readouterr().err
    assert code == 3
    assert "refusing to start" in err and "DEFER" in err and "concurrency" in err


def test_serve_evidence_needs_a_profile_file(
    store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LANE_ROUTER_CONFIG", raising=False)
    assert main(["serve", "--require-evidence", str(store)]) == 2
    assert "needs a profile file" in capsys.readouterr().err


def test_a_bad_slo_option_is_a_usage_error(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _write_profile(tmp_path, config_a(), 8)
    assert main(["check", str(profile), "--evidence", str(store), "--slo", "p95_ttft=3"]) == 2
    assert "--slo" in capsys.readouterr().err


def _check(profile: Path, store: Path) -> list[str]:
    return ["check", str(profile), "--evidence", str(store)]


def _serve(profile: Path, store: Path) -> list[str]:
    return ["serve", "--config", str(profile), "--require-evidence", str(store)]


@pytest.mark.parametrize("argv", [_check, _serve], ids=["check", "serve"])
@pytest.mark.parametrize("build", CASES.values(), ids=CASES.keys())
def test_the_gate_refuses_unusable_evidence_with_exit_2_not_a_decision(
    argv: Callable[[Path, Path], list[str]],
    build: Callable[[Path], BadEvidence],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = build(tmp_path)
    command = argv(_write_profile(tmp_path, config_a(), 8), bad.store)
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert "evidence:" not in out  # no decision table, not even a partial one
    assert_refused(err, bad, command[0])


def test_the_installed_command_refuses_a_tampered_store_in_one_line(tmp_path: Path) -> None:
    bad = tampered(tmp_path)
    argv = [sys.executable, "-m", "router", *_check(_write_profile(tmp_path, config_a(), 8), bad.store)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert_refused(done.stderr, bad, "check")


def test_a_branch_name_revision_defers_every_lane_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on_main = config_a().model_copy(update={"model_revision": "main"})
    store = tmp_path / "evidence"
    EvidenceStore(store).add(measured(on_main))
    profile = _write_profile(tmp_path, on_main, 8)
    assert main(_check(profile, store)) == 3
    evidence = capsys.readouterr().out.split("evidence:")[1]
    assert evidence.count(" DEFER ") == evidence.count("provenance_incomplete") == 6
    # One note per problem, naming the lanes it holds back: the record's revision and the profile's.
    notes = [line.split(": ", 1) for line in evidence.splitlines() if "immutable" in line]
    assert [message.split(" ", 1)[0] for _, message in notes] == ["model_revision", "current.model_revision"]
    for lanes, message in notes:
        assert set(lanes.split(", ")) == {cls.value for cls in RequestClass}
        assert message.split(" ", 1)[1].startswith(
            "'main' is not an immutable revision (a branch or tag name moves)"
        )
    assert main(_serve(profile, store)) == 3
    assert "refusing to start" in capsys.readouterr().err


def test_check_judges_every_lane_of_every_model(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _write_profile(tmp_path, config_a(), 8)
    data = yaml.safe_load(profile.read_text())
    data["pools"]["embed"] = {"backends": ["http://127.0.0.1:8102"], "model": "bge"}
    profile.write_text(yaml.safe_dump(data))

    assert main(["check", str(profile), "--evidence", str(store)]) == 3
    table = capsys.readouterr().out.split("evidence:")[1]
    rows = {line.split()[0]: line for line in table.splitlines() if line}
    for cls in RequestClass:
        assert " PASS " in rows[cls.value]
        assert " DEFER " in rows[f"bge:{cls.value}"] and "no_evidence" in rows[f"bge:{cls.value}"]
