"""The worked example end to end, at a small scale: real simulated engines, the real router and
the real `lane-router` commands on loopback, then the evidence they leave behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.config.load import load_profile
from router.config.models import RequestClass
from router.evidence.identity import serving_configuration
from router.evidence.store import EvidenceStore
from router.evidence.verdicts import LaneVerdict
from router.lab.evidence.example import BULK, INTERACTIVE, INTERACTIVE_LANES
from router.lab.evidence.walkthrough import Paths, Scale, prepare, problems, run_example, shown

# The example's 55 seeded requests in 10 s instead of 24: enough samples per lane, and more
# than enough concurrency. The machine running tests is shared, so latency bounds are relaxed:
# this checks the wiring and the decisions, not the simulator's speed.
SMALL = Scale(rate=6.0, duration=10.0, warmup=0.0, drain=60.0, slo=("p95_ttft_ms=60000",))


def _by_lane(verdicts: list[LaneVerdict]) -> dict[RequestClass, LaneVerdict]:
    return {v.cls: v for v in verdicts}


@pytest.mark.timeout(300)
def test_the_worked_example_runs_on_the_simulator(tmp_path: Path) -> None:
    paths = Paths.under(tmp_path / "example")
    printed: list[str] = []
    outcome = run_example(paths, SMALL, printed.append)
    text = "\n".join(printed)

    identity = {
        config: serving_configuration(load_profile(path).pools[INTERACTIVE]).identity
        for config, path in (("A", paths.profile_a), ("B", paths.profile_b))
    }
    records = {r.record_id: r for r in EvidenceStore(paths.evidence)}
    # Two measurements, each filing one record per lane it measured (chat and long-context).
    assert len(records) == 4
    for record in records.values():
        assert record.context.protocol.tool == "lane-router bench run"
        assert record.context.protocol.sample_count >= 20
        assert record.identity.vllm_version == "0.32.0"  # as the engines reported on /version
        assert record.security_boundary_note

    a = _by_lane(outcome.a_checked)
    assert {v.decision.final_decision for v in a.values()} == {"PASS"}
    chat_a = records[a[RequestClass.CHAT].decision.record_id or ""]
    assert chat_a.identity.server_configuration_hash == identity["A"].server_configuration_hash
    assert chat_a.measured_slice.concurrency >= 8
    assert (chat_a.measured_slice.input_tokens.max, chat_a.measured_slice.output_tokens.max) == (2048, 512)
    assert (chat_a.context.knobs.tensor_parallel_size, chat_a.context.knobs.max_model_len) == (1, 8192)
    assert outcome.a_served is not None and outcome.a_served.code == 0
    assert outcome.a_wider is not None and outcome.a_wider.code == 3
    wider = dict(line.split(None, 1) for line in outcome.a_wider.output.splitlines()[1:])
    assert (wider["final_decision"], wider["reason_class"]) == ("DEFER", "outside_measured_slice")
    assert wider["triggers"].split(", ")[0] == "request_shape"

    b = _by_lane(outcome.b_checked)
    for cls, verdict in b.items():
        if cls in INTERACTIVE_LANES:
            assert verdict.decision.final_decision == "DEFER"
            assert verdict.decision.reason_class == "configuration_changed"
            assert verdict.decision.triggers == ("config_hash", "parallelism", "max_model_len")
            assert verdict.decision.record_id == chat_a.record_id
        else:
            assert verdict.pool == BULK and verdict.decision.final_decision == "PASS"
    assert outcome.b_refused is not None and outcome.b_refused.code == 3
    assert "refusing to start" in outcome.b_refused.output

    again = _by_lane(outcome.b_rechecked)
    assert {v.decision.final_decision for v in again.values()} == {"PASS"}
    chat_b = records[again[RequestClass.CHAT].decision.record_id or ""]
    assert chat_b.identity.server_configuration_hash == identity["B"].server_configuration_hash
    assert identity["B"].server_configuration_hash != identity["A"].server_configuration_hash
    assert outcome.diff is not None and outcome.diff.code == 1
    assert (
        "retest triggers (A's evidence for B): config_hash, parallelism, max_model_len" in outcome.diff.output
    )
    assert problems(outcome) == []

    assert "$ lane-router bench run --url http://127.0.0.1:" in text
    assert paths.key.read_text().strip() not in text  # the key is read from its file, never printed


def test_the_example_wants_a_fresh_directory(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text("{}")
    with pytest.raises(ValueError, match="not empty"):
        prepare(Paths.under(tmp_path), SMALL)


def test_commands_are_shown_without_the_key(tmp_path: Path) -> None:
    paths = Paths.under(tmp_path / "ex")
    prepare(paths, SMALL)
    key = paths.key.read_text().strip()
    line = shown(["bench", "run", "--key", key, "--rate", "2"], paths)
    assert key not in line
    assert line == f'lane-router bench run --key "$(cat {paths.key})" --rate 2'
