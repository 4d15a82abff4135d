"""`lane-router bench prefix`: placements compared on the virtual clock, short runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli import main
from router.lab.bench.prefix import Scenario, balance_of, run_all
from router.lab.sim.timing import load_preset

WORKLOADS = Path(__file__).resolve().parents[3] / "config" / "workloads"


def test_precise_placement_hits_more_of_the_cache_than_prefix_affinity_under_pressure() -> None:
    # Shared instructions before each document, caches that hold a fraction of the documents.
    pressure = Scenario("pressure", "prefix-rag.yaml", rate=10.0, duration=15.0, blocks=10_000)
    precise, approximate = run_all(
        [pressure], ["precise_prefix", "prefix_affinity"], load_preset("h100-llama3-8b"), workloads=WORKLOADS
    )
    assert precise.sent == approximate.sent > 100
    assert precise.hit_rate > approximate.hit_rate


def test_the_command_writes_its_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prefix"
    code = main(
        [
            "bench",
            "prefix",
            "--scenarios",
            "churn",
            "--strategies",
            "precise_prefix,least_outstanding",
            "--duration",
            "4",
            "--workloads",
            str(WORKLOADS),
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    table = (out / "prefix.md").read_text(encoding="utf-8")
    assert table.startswith("```\nlane-router ")  # the command that wrote it
    for strategy in ("precise_prefix", "least_outstanding"):
        assert f"| churn | {strategy} |" in table
        assert f"| churn | {strategy} |" in printed
    assert (out / "prefix.png").read_bytes().startswith(b"\x89PNG")


def test_a_strategy_may_carry_its_settings() -> None:
    assert balance_of("least_outstanding") == "least_outstanding"
    assert balance_of("prefix_affinity:min_tokens=1024:affinity=session") == {
        "strategy": "prefix_affinity",
        "min_tokens": 1024,
        "affinity": "session",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        balance_of("precise_prefix:penalty")
