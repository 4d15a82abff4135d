from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from router.cli import main
from router.evidence import load_records
from router.lab.bench.cli import parse_rates
from router.lab.bench.outcome import read_jsonl
from router.lab.bench.stack import local_stack
from tests.lab.bench.lab import one_pool, quick_workload, two_pools


def test_parse_rates() -> None:
    assert parse_rates("5,10,20") == (5.0, 10.0, 20.0)
    assert parse_rates("5:20:5") == (5.0, 10.0, 15.0, 20.0)
    assert parse_rates("0.5:1.5:0.5") == (0.5, 1.0, 1.5)
    for bad in ("", "5:1:1", "1:5:0"):
        with pytest.raises(ValueError):
            parse_rates(bad)


@pytest.fixture
def workload_file(tmp_path: Path) -> Path:
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump(quick_workload().model_dump(mode="json")))
    return path


def test_bench_run_virtual_writes_jsonl_and_exits_by_the_gate(
    tmp_path: Path, workload_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump(two_pools(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])))
    out = tmp_path / "run.jsonl"
    code = main(
        [
            "bench",
            "run",
            "--virtual",
            "--profile",
            str(profile),
            "--workload",
            str(workload_file),
            "--preset",
            "cpu-tiny",
            "--rate",
            "10",
            "--duration",
            "5",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0 and "| **all** |" in printed and str(out) in printed
    rows = list(read_jsonl(out))
    assert rows and all(r.ok and r.lane for r in rows)
    assert [r.arrival for r in rows] == sorted(r.arrival for r in rows)


def test_bench_run_reports_config_errors_with_paths(
    tmp_path: Path, workload_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(workload_file.read_text())
    data["classes"]["chat"]["share"] = 2
    workload_file.write_text(yaml.safe_dump(data))
    code = main(
        ["bench", "run", "--url", "http://127.0.0.1:1", "--workload", str(workload_file), "--rate", "1"]
    )
    assert code == 2 and "classes.chat.share: must be ≤ 1" in capsys.readouterr().err


@pytest.mark.timeout(90)
def test_bench_run_against_a_live_router_writes_evidence_per_lane(
    tmp_path: Path, workload_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = two_pools(["http://127.0.0.1:1", "http://127.0.0.1:2"], ["http://127.0.0.1:3"])
    with local_stack(data, "cpu-tiny") as stack:
        code = main(
            [
                "bench",
                "run",
                "--url",
                stack.url,
                "--key",
                stack.key,
                "--workload",
                str(workload_file),
                "--rate",
                "10",
                "--duration",
                "3",
                "--profile",
                str(stack.profile_path),
                "--out",
                str(tmp_path / "live.jsonl"),
                "--evidence",
                str(tmp_path / "evidence"),
                "--no-progress",
                "--drain",
                "30",
            ]
        )
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = list(read_jsonl(tmp_path / "live.jsonl"))
    lanes = {r.lane for r in rows}
    records = load_records(tmp_path / "evidence")
    assert len(records) == len(lanes) >= 4
    for record in records:
        assert record.identity.vllm_version == "0.32.0"  # as the simulated servers report it
        assert record.security_boundary_note and "router proxies only" in record.security_boundary_note
        assert record.context.warmup.value == "skipped"
        assert record.context.protocol.tool == "lane-router bench run"
    assert printed.count("evidence for lane") == len(records)
    assert orjson.loads((tmp_path / "live.jsonl").read_bytes().splitlines()[0])["status"] == 200


@pytest.mark.timeout(120)
def test_compare_in_real_time_starts_each_profile_on_loopback(
    tmp_path: Path, workload_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = []
    for data in (
        one_pool(["http://127.0.0.1:1", "http://127.0.0.1:2"]),
        two_pools(["http://127.0.0.1:1"], ["http://127.0.0.1:2"]),
    ):
        path = tmp_path / f"{data['profile']}.yaml"
        path.write_text(yaml.safe_dump(data))
        profiles.append(str(path))
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "compare",
            "--mode",
            "realtime",
            "--profiles",
            *profiles,
            "--rate",
            "8",
            "--duration",
            "2",
            "--workload",
            str(workload_file),
            "--preset",
            "cpu-tiny",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    results = orjson.loads((out / "results.json").read_bytes())
    assert results["mode"] == "realtime" and results["profiles"] == ["one-pool", "two-pools"]
    for point in results["points"]:
        assert point["accepted_share"] == 1.0
        lanes = point["classes"]["batch"]["lanes"]
        assert lanes == {"batch": point["classes"]["batch"]["sent"]}  # from the live router's headers
    assert (out / "report.md").read_text().startswith("# Mixed-traffic comparison: one-pool, two-pools")
