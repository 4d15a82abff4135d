"""The API server as one FIFO loop: the model itself, on the virtual clock, and over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from router.lab.sim.config import EngineConfig
from router.lab.sim.engine import Engine
from router.lab.sim.frontend import Frontend
from router.lab.sim.frontendfit import BurstPoint, fit_frontend, simulated_overhead
from router.lab.sim.frontendprobe import engine_times
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timedstream import completion_body, timed_stream
from router.lab.sim.timing import StepTimeModel, load_preset
from router.lab.sim.vclock import TraceRequest, VirtualBackend, simulate
from tests.lab.sim.enginehelp import req

STEP = StepTimeModel(c0=0.005, c_prefill=1e-5, c_decode=2e-4, c_ctx=0.0)
CONFIG = EngineConfig(max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=64, num_gpu_blocks=1024)


def completion(rid: str, t: float, prompt: int, tokens: int, tag: int) -> TraceRequest:
    ids = [3 + (tag * 131 + i) % 1990 for i in range(prompt)]
    body = {"model": "m", "prompt": ids, "max_tokens": tokens, "ignore_eos": True}
    return TraceRequest(rid, t, body, kind="completion")


def run(timing: StepTimeModel, trace: list[TraceRequest]) -> dict[str, float]:
    """Each request's time to first token on the virtual clock."""
    backend = VirtualBackend("b", "p", CONFIG, timing, served_model_names=("m",))
    result = simulate([backend], trace, lambda _s, _t: 0)
    return {r.request_id: r.ttft for r in result.records if r.ttft is not None}


# ---- the FIFO server ---------------------------------------------------------------------------
def test_jobs_queue_in_arrival_order_on_one_server() -> None:
    fe = Frontend(STEP.with_frontend(0.002, 1e-6, 1e-4))
    assert fe.admit(0.0, 1000) == pytest.approx(0.003)  # 2 ms + 1,000 × 1 µs
    assert fe.admit(0.0, 0) == pytest.approx(0.005)  # behind the first
    assert fe.emit(0.001, 10) == pytest.approx(0.006)  # tokens wait for both admissions
    assert fe.emit(0.010, 10) == pytest.approx(0.011)  # the loop was idle again
    assert fe.busy_time == pytest.approx(0.007)


def test_parallel_latency_is_not_taken_on_the_loop() -> None:
    fe = Frontend(dataclasses.replace(STEP.with_frontend(0.002, 0.0, 0.0), frontend_s=0.010))
    assert [fe.admit(0.0, 10) for _ in range(3)] == pytest.approx([0.012, 0.014, 0.016])


def test_without_serial_costs_nothing_waits() -> None:
    fe = Frontend(dataclasses.replace(STEP, frontend_s=0.003))
    assert [fe.admit(1.0, 500) for _ in range(4)] == pytest.approx([1.003] * 4)
    assert fe.emit(1.0, 64) == 1.0


def test_negative_costs_are_refused() -> None:
    with pytest.raises(ValueError):
        STEP.with_frontend(0.0, -1e-6, 0.0)


# ---- the engine stamps queue time as vLLM's core does ------------------------------------------
def test_a_request_arriving_mid_step_is_queued_at_the_step_boundary() -> None:
    engine = Engine(CONFIG, STEP)
    engine.add_request(req("a", 64, 4), 0.0)
    first = engine.step(0.0)
    assert first is not None
    late = req("b", 64, 4)
    engine.add_request(late, first.start + first.duration / 2)
    engine.step(first.end)
    assert late.queued_time == first.end
    assert late.scheduled_time == first.end


# ---- the mechanism on the virtual clock --------------------------------------------------------
def test_a_burst_is_admitted_one_request_after_another() -> None:
    admit = 0.004
    timing = STEP.with_frontend(admit, 0.0, 0.0)
    ttft = run(timing, [completion(f"r{i}", 0.0, 32, 2, i) for i in range(8)])
    parallel = run(STEP, [completion(f"r{i}", 0.0, 32, 2, i) for i in range(8)])
    # The last admission ends 8 × 4 ms after the burst; without the serial loop all are in at 0.
    assert max(ttft.values()) - max(parallel.values()) >= 7 * admit
    # First tokens wait on the loop behind every admission queued before them.
    assert min(ttft.values()) >= 8 * admit


def test_longer_prompts_take_longer_to_admit() -> None:
    timing = STEP.with_frontend(0.0, 5e-6, 0.0)
    short = run(timing, [completion("s", 0.0, 16, 2, 1)])["s"]
    long = run(timing, [completion("l", 0.0, 1016, 2, 1)])["l"]
    step_gap = STEP.prefill_time(1016) - STEP.prefill_time(16)
    assert long - short == pytest.approx(step_gap + 1000 * 5e-6)


def test_decoding_streams_delay_a_new_request() -> None:
    out = 4e-4
    streams = [completion(f"s{i}", 0.0, 32, 200, i) for i in range(16)]
    probe = completion("probe", 0.3, 32, 2, 99)
    quiet = run(STEP, [*streams, probe])["probe"]
    busy = run(STEP.with_frontend(0.0, 0.0, out), [*streams, probe])["probe"]
    # The probe's first token leaves with the 16 streams' tokens of its step, at least.
    assert busy - quiet >= 16 * out


def test_a_burst_holds_back_the_tokens_of_running_streams() -> None:
    admit = 0.01
    timing = STEP.with_frontend(admit, 0.0, 0.0)
    trace = [completion("stream", 0.0, 32, 100, 1)] + [
        completion(f"b{i}", 0.1, 32, 2, 10 + i) for i in range(6)
    ]
    backend = VirtualBackend("b", "p", CONFIG, timing, served_model_names=("m",))
    stream = next(r for r in simulate([backend], trace, lambda _s, _t: 0).records if r.request_id == "stream")
    # The stream's tokens wait behind the six admissions queued ahead of them on the loop.
    assert max(stream.itl) >= 5 * admit


def test_no_serial_costs_leave_a_preset_unchanged() -> None:
    h100 = load_preset("h100-llama3-8b").timing
    assert (h100.frontend_request_s, h100.frontend_prompt_token_s, h100.frontend_output_token_s) == (0, 0, 0)
    ttft = run(dataclasses.replace(STEP, frontend_s=0.003), [completion("r", 0.0, 100, 2, 1)])["r"]
    assert ttft == pytest.approx(0.003 + STEP.prefill_time(100))


# ---- the fit -----------------------------------------------------------------------------------
def test_fit_recovers_known_frontend_costs_from_simulated_probes() -> None:
    # A step model like the tiny CPU model's, and vLLM's CPU defaults.
    step = StepTimeModel(c0=0.0065, c_prefill=1.03e-5, c_decode=2.65e-4, c_ctx=5.9e-7, c_attn=7.5e-8)
    engine = EngineConfig(max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=128, block_size=128)
    true = dataclasses.replace(step.with_frontend(0.0015, 2e-6, 2e-4), frontend_s=0.003)
    round_trip = 0.004
    shapes = (
        (0, 1, 32),
        (0, 1, 1024),
        (0, 4, 32),
        (0, 16, 32),
        (8, 1, 32),
        (16, 1, 32),
        (32, 1, 32),
        (16, 8, 32),
    )
    points = [
        BurstPoint(k, n, p, round_trip + simulated_overhead(true, engine, BurstPoint(k, n, p, 0.0)))
        for k, n, p in shapes
    ]
    got = fit_frontend(points, step, engine)
    assert got.request_s == pytest.approx(0.0015, rel=0.1)
    assert got.prompt_token_s == pytest.approx(2e-6, rel=0.1)
    assert got.output_token_s == pytest.approx(2e-4, rel=0.1)
    assert got.constant == pytest.approx(round_trip + 0.003, rel=0.1)


def test_engine_times_reads_queue_and_prefill_histograms() -> None:
    engine = Engine(CONFIG, STEP)
    assert engine_times(engine.render_metrics("m")) == (0.0, 0.0)
    requests = [req(f"r{i}", 64, 2) for i in range(3)]
    for r in requests:
        engine.add_request(r, 0.0)
    t = 0.0
    while engine.has_work:
        result = engine.step(t)
        assert result is not None
        t = result.end
    count, total = engine_times(engine.render_metrics("m")) or (0.0, 0.0)
    assert count == 3
    assert total == pytest.approx(sum((r.first_token_time or 0.0) - r.queued_time for r in requests))


# ---- over HTTP -----------------------------------------------------------------------------------
async def _streams(timing: StepTimeModel, n: int, tokens: int) -> list[tuple[float, list[float]]]:
    """Time to first token and token gaps of `n` simultaneous streams."""
    spec = EngineSpec(0, CONFIG, timing, ServerSettings(served_model_names=("m",)))
    async with (
        SimCluster([spec]) as cluster,
        httpx.AsyncClient(base_url=cluster.urls[0], timeout=30) as client,
    ):
        body = completion_body("m", list(range(3, 35)), tokens)
        runs = await asyncio.gather(*(timed_stream(client, body) for _ in range(n)))
    return [(r.ttft, r.gaps) for r in runs]


async def test_the_server_admits_a_burst_serially() -> None:
    admit = 0.03
    ttfts = [t for t, _ in await _streams(STEP.with_frontend(admit, 0.0, 0.0), 4, 2)]
    # No first token leaves before the loop has admitted all four (FIFO); taken in parallel,
    # each would be out after one admission and a step.
    assert min(ttfts) >= 4 * admit * 0.9


async def test_the_server_hands_out_tokens_at_the_loops_pace() -> None:
    out = 0.02  # 4 streams × 20 ms a step: the loop, not the 6 ms step, sets the pace
    runs = await _streams(STEP.with_frontend(0.0, 0.0, out), 4, 12)
    gaps = [g for _, gs in runs for g in gs[2:]]
    assert sum(gaps) / len(gaps) >= 4 * out * 0.9
