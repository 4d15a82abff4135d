"""The lane experiments' pieces against in-process simulated servers: the harness's client on a
plan, a slow reader by bytes per second, and what the servers note of each delivery."""

from __future__ import annotations

from dataclasses import replace

from router.lab.bench import laneplans
from router.lab.bench.generate import wire_id
from router.lab.bench.lanepolicies import OPTIONS, lab_profile, summary
from router.lab.bench.loadclient import Endpoint
from router.lab.bench.outcome import Outcome
from router.lab.bench.realtime import run_items
from router.lab.sim.config import EngineConfig
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import StepTimeModel

TIMING = StepTimeModel(c0=0.002, c_prefill=1e-6, c_decode=1e-5, c_ctx=0.0)
CONFIG = EngineConfig(max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=16, num_gpu_blocks=1024)
SPEC = EngineSpec(0, CONFIG, TIMING, ServerSettings(served_model_names=("m",)))


async def test_a_stream_is_timed_and_its_usage_read() -> None:
    request = laneplans.planned(
        "t", 1, 0.0, laneplans.body("m", [{"role": "user", "content": "hello"}], 20), 2
    )
    async with SimCluster([SPEC], note_deliveries=True) as cluster:
        (outcome,) = await run_items([request], Endpoint(cluster.urls[0], None), OPTIONS)
        delivery = cluster.delivery(wire_id(request.request_id))
    assert outcome.ok and outcome.output_tokens == 20 and outcome.output_chars == 4 * 20
    assert outcome.ttft is not None and outcome.ttft > 0 and len(outcome.gaps) >= 10
    assert delivery is not None and delivery.finished is not None
    assert cluster.delivery("other") is None
    assert summary([outcome])["ok"] == 1.0


async def test_a_slow_reader_gets_every_token_at_its_own_pace() -> None:
    payload = laneplans.body("m", [{"role": "user", "content": "hello"}], 300)
    request = replace(laneplans.planned("slow", 2, 0.0, payload, 2), read_bytes_per_s=100_000)
    async with SimCluster([SPEC], note_deliveries=True) as cluster:
        (outcome,) = await run_items([request], Endpoint(cluster.urls[0], None), OPTIONS)
        delivery = cluster.delivery(wire_id(request.request_id))
    assert outcome.ok and outcome.output_tokens == 300 and outcome.output_chars == 4 * 300
    assert delivery is not None and delivery.finished is not None and outcome.e2e is not None
    # ~250 bytes an event: reading them at 100 kB/s takes longer than the engine took to write.
    assert outcome.e2e > 300 * 150 / 100_000


def test_a_session_affinity_applies_to_the_agent_lane_only() -> None:
    balance = {"strategy": "prefix_affinity", "affinity": "session", "min_tokens": 512}
    lanes = lab_profile(["http://127.0.0.1:9"], {}, {"balance": balance})["lanes"]
    assert lanes["agent"]["balance"]["affinity"] == "session"
    assert {lanes[c]["balance"]["affinity"] for c in lanes if c != "agent"} == {"prefix"}


def test_the_command_line_names_every_experiment() -> None:
    from router.lab.bench.cli import EXPERIMENT_NAMES
    from router.lab.bench.lanepolicies import EXPERIMENTS

    assert tuple(sorted(EXPERIMENTS)) == EXPERIMENT_NAMES


def test_the_summary_reads_percentiles_of_the_answered_requests() -> None:
    answered = [
        Outcome(f"r{i}", "chat", 0.0, True, status=200, ttft=i / 100, gaps=[i / 1000], e2e=i / 10)
        for i in range(1, 101)
    ]
    failed = Outcome("x", "chat", 0.0, True, status=503, ttft=9.0, e2e=9.0)
    s = summary([*answered, failed])
    assert (s["n"], s["ok"]) == (101.0, 100.0)
    assert (s["ttft_p50"], s["ttft_p95"]) == (0.5, 0.95)
    assert (s["itl_p50"], s["itl_p95"], s["e2e_p95"]) == (0.05, 0.095, 9.5)
