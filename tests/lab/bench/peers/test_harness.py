"""A tiny peers run, for real: fake backends, lane-router and the bare proxy as processes of
their own on loopback, the own load generator; the peers that are not there are reported."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

from router.lab.bench.peers import harness
from router.lab.bench.peers.__main__ import main, parser, settings

NUMBER = re.compile(r"[\d,]+(?:\.\d+)?")


def _table(out: str) -> list[list[str]]:
    rows = [line for line in out.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _first_number(cell: str) -> float:
    found = NUMBER.search(cell)
    assert found, cell
    return _number(found.group())


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.timeout(600)  # a dozen processes start on a shared 2-core machine
def test_a_tiny_run_measures_the_proxies_present_and_reports_the_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--targets",
        "lane-router,vllm-router,nginx,bare,direct",
        "--scale",
        "0.1",
        "--max-requests",
        "2000",
    ]
    argv += ["--vllm-router", str(tmp_path / "no-vllm-router"), "--nginx", str(tmp_path / "no-nginx")]
    argv += ["--wrk", "", "--run-dir", str(tmp_path / "run")]
    if len(os.sched_getaffinity(0)) < 2:
        argv.append("--no-pin")
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Command: `python -m router.lab.bench.peers --targets" in captured.out
    assert "Load average (1/5/15 min):" in captured.out
    assert "Errors: none" in captured.out
    assert "3 rounds in which the targets take turns" in captured.out
    assert captured.err.count("] round 3 of 3") == 2  # a set of rounds per fake backend
    assert "vLLM Router: skipped, not installed" in captured.err

    head, rule, *rows = _table(captured.out)
    assert head == ["scenario", "lane-router", "vLLM Router", "nginx", "bare Python", "direct"]
    assert len(rule) == len(head)
    assert [row[0][:2] for row in rows] == ["1 ", "2 ", "3 ", "4 "]
    for row in rows:
        assert len(row) == len(head)
        lane_router, vllm_router, nginx, bare, direct = row[1:]
        assert vllm_router.startswith("not installed") and nginx.startswith("not installed")
        if row[0].startswith(("1 ", "2 ", "3 ")):
            assert _first_number(lane_router) > 0 and _first_number(bare) > 0  # CPU µs or core %
            assert direct.startswith("— ") and ";" not in direct  # no proxy, no proxy CPU
    whole_us = [re.match(r"([\d,.]+) \(([\d,.]+); ", cell) for row in rows[:2] for cell in row[1:5:3]]
    assert all(m and 0 < _number(m.group(2)) <= _number(m.group(1)) for m in whole_us)  # user within all
    paced_us = [re.search(r"; ([\d.]+) µs \(([\d.]+)\)", cell) for cell in rows[2][1:5:3]]
    assert all(m and 0 < float(m.group(2)) <= float(m.group(1)) for m in paced_us)  # user within all
    assert re.fullmatch(r"[+-]\d+\.\d / [+-]\d+\.\d", rows[3][1])  # added TTFT vs direct


@pytest.mark.timeout(600)
def test_together_every_round_loads_the_targets_at_the_same_time(tmp_path: Path) -> None:
    argv = ["--targets", "lane-router,bare", "--scenarios", "nonstream,paced", "--scale", "0.2"]
    argv += ["--rounds", "2", "--together", "--wrk", "", "--max-requests", "2000", "--warmup", "0"]
    if len(os.sched_getaffinity(0)) < 2:
        argv.append("--no-pin")
    s = settings(parser().parse_args(argv), tmp_path / "run")
    assert s.together
    run = harness.run(s, lambda line: None)

    by_label = {result.label: result for result in run.results}
    assert set(by_label) == {"lane-router", "bare Python"}
    for name in ("nonstream", "paced"):
        rounds = [by_label[label].rounds[name] for label in by_label]
        assert [len(r) for r in rounds] == [2, 2]
        for turn in range(2):
            windows = [r[turn].window for r in rounds]
            # Both loads of a round ran in the same seconds: each began before the other ended.
            assert max(start for start, _ in windows) < min(end for _, end in windows)
            assert all(r[turn].load.requests > 0 and not r[turn].load.errors for r in rounds)
        # The rounds themselves follow one another.
        assert max(r[0].window[1] for r in rounds) <= min(r[1].window[0] for r in rounds)


@pytest.mark.timeout(600)
def test_in_turns_no_two_targets_load_at_the_same_time(tmp_path: Path) -> None:
    argv = ["--targets", "lane-router,bare", "--scenarios", "nonstream", "--scale", "0.2"]
    argv += ["--rounds", "2", "--wrk", "", "--max-requests", "2000", "--warmup", "0"]
    if len(os.sched_getaffinity(0)) < 2:
        argv.append("--no-pin")
    run = harness.run(settings(parser().parse_args(argv), tmp_path / "run"), lambda line: None)

    windows = sorted(m.window for result in run.results for m in result.rounds["nonstream"])
    assert len(windows) == 4
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(windows))
