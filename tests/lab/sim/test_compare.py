from __future__ import annotations

import pytest

from router.lab.sim.compare import (
    Check,
    Level,
    Observed,
    compare,
    format_levels,
    latency_workload,
    percentile,
    prefix_workload,
    run_workload,
    summarize,
)
from router.lab.sim.config import EngineConfig
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.timedstream import PauseDetector, TimedStream
from router.lab.sim.timing import StepTimeModel
from router.lab.sim.virtualtime import run_in_virtual_time

BASE = StepTimeModel(c0=0.004, c_prefill=2e-5, c_decode=2e-4, c_ctx=1e-7, frontend_s=0.003)


def test_latency_workload_is_seeded_and_within_its_ranges() -> None:
    a, b = latency_workload(40, seed=4), latency_workload(40, seed=4)
    assert a == b and a != latency_workload(40, seed=5)
    assert all(50 <= len(j.prompt) <= 1500 and 16 <= j.max_tokens <= 256 for j in a)
    # Log-uniform: both ends of each range show up, not only the middle.
    assert min(len(j.prompt) for j in a) < 150 and max(len(j.prompt) for j in a) > 700
    # Independent requests: no two share a first KV block.
    assert len({tuple(j.prompt[:16]) for j in a}) == len(a)


def test_a_new_salt_keeps_the_lengths_and_changes_every_prompt() -> None:
    a, b = latency_workload(30, seed=2, salt=1), latency_workload(30, seed=2, salt=2)
    assert [(len(j.prompt), j.max_tokens) for j in a] == [(len(j.prompt), j.max_tokens) for j in b]
    assert not {tuple(j.prompt[:16]) for j in a} & {tuple(j.prompt[:16]) for j in b}
    p, q = prefix_workload(seed=3, salt=1), prefix_workload(seed=3, salt=2)
    assert sorted(len(j.prompt) for j in p) == sorted(len(j.prompt) for j in q)
    assert not {tuple(j.prompt[:16]) for j in p} & {tuple(j.prompt[:16]) for j in q}


def test_prefix_workload_repeats_each_document() -> None:
    jobs = prefix_workload(docs=5, questions=4, seed=1)
    assert len(jobs) == 20
    heads = {tuple(j.prompt[:400]) for j in jobs}  # documents are ≥ 400 tokens
    assert len(heads) == 5


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.95) == 95.0
    assert percentile(values, 0.5) == 50.0
    assert percentile([3.0], 0.95) == 3.0


def test_samples_timed_across_a_client_pause_are_left_out() -> None:
    # Tokens every 10 ms; the client stalled from 0.2 to 0.5 s, so the token read at 0.5 s (the
    # next ones were ready meanwhile) came late and the three after it arrived as a burst.
    times = [0.01 * i for i in range(1, 21)] + [0.5, 0.5, 0.5, 0.5] + [0.5 + 0.01 * i for i in range(1, 11)]
    stream = TimedStream(0.0, times, 100)
    pauses = PauseDetector(settle=0.005)
    pauses.pauses.append((0.2, 0.5))
    raw, clean = summarize([stream], 0.0), summarize([stream], 0.0, pauses)
    assert raw.dropped == 0.0 and clean.itl_p50 == pytest.approx(0.01)
    # 34 samples (1 TTFT, 33 gaps). Left out: 0.2 → 0.5, the three 0-gaps of the burst and the
    # gap after it (it starts at a late timestamp); the gap ending at 0.2 is clean.
    assert clean.dropped == pytest.approx(5 / 34)


def test_a_sample_that_only_contains_a_pause_is_kept() -> None:
    pauses = PauseDetector(settle=0.01)
    pauses.pauses.append((0.10, 0.15))
    # Sent before the pause, first token read long after it: both timestamps are true.
    assert not pauses.spoils(0.0, 0.40)
    # The token read just after the pause ended may have waited through it.
    assert pauses.spoils(0.0, 0.155) and pauses.spoils(0.0, 0.12)
    # A pause right after the start delayed the request itself.
    assert pauses.spoils(0.095, 0.40)
    # Long and short TTFTs on one busy client: only the one read right after a pause goes.
    streams = [TimedStream(0.0, [0.40], 10), TimedStream(0.13, [0.152], 10), TimedStream(0.30, [0.31], 10)]
    kept = summarize(streams, 0.0, pauses)
    assert kept.dropped == pytest.approx(1 / 3)
    assert kept.ttft_p95 == pytest.approx(0.40)


def test_compare_applies_both_tolerances() -> None:
    real = Observed(0.100, 0.200, 0.010, 0.020, 0.40, 10)
    close = Observed(0.120, 0.240, 0.0085, 0.024, 0.48, 10)
    far = Observed(0.130, 0.200, 0.010, 0.020, 0.55, 10)
    assert all(c.ok for c in compare(real, close))
    bad = {c.name for c in compare(real, far) if not c.ok}
    assert bad == {"ttft_p50", "hit_rate"}
    assert compare(real, far)[0].error == pytest.approx(0.30)


def test_levels_table_marks_misses() -> None:
    checks = [Check("ttft_p50", 0.010, 0.0135, False), Check("itl_p50", 0.002, 0.0021, True)]
    table = format_levels([Level(4, 1.5, checks, (0.02, 0.0))]).splitlines()
    assert table[0].startswith("| conc | load | ttft_p50 real")
    assert table[2] == "| 4 | 1.5 | 10.0 | 13.5 | +35% ✗ | 2.0 | 2.1 | +5% | 2% / 0% |"


def test_two_identical_simulators_agree_and_a_slower_one_does_not() -> None:
    # In virtual time: the twins are timed by their model alone, not by the host's load.
    run_in_virtual_time(_identical_simulators_agree_and_a_slower_one_does_not())


async def _identical_simulators_agree_and_a_slower_one_does_not() -> None:
    config = EngineConfig(max_model_len=2048, max_num_batched_tokens=2048, num_gpu_blocks=4096)
    slow = StepTimeModel(c0=0.008, c_prefill=4e-5, c_decode=4e-4, c_ctx=2e-7, frontend_s=0.006)
    specs = [EngineSpec(port=0, config=config, timing=t) for t in (BASE, BASE, slow)]
    async with SimCluster(specs) as cluster:
        jobs = latency_workload(16, seed=1, output=(16, 48))
        ref, twin, slower = [await run_workload(url, jobs, concurrency=4) for url in cluster.urls]
    assert ref.hit_rate == 0.0  # random prompts share nothing
    assert [c.name for c in compare(ref, twin) if not c.ok] == []
    assert {c.name for c in compare(ref, slower) if not c.ok} >= {"itl_p50", "ttft_p50"}
    assert slower.itl_p50 == pytest.approx(2 * ref.itl_p50, rel=0.05)


async def test_prefix_hit_rate_is_what_the_block_size_allows() -> None:
    """One at a time, a document's first request misses and every later one hits the document's
    full blocks (the block holding the document's end and the question differs)."""
    block = 128
    jobs = prefix_workload(docs=3, questions=3, seed=2)
    seen: set[tuple[int, ...]] = set()
    hits = queries = 0
    for job in jobs:
        doc = max(_common_prefix(job.prompt, other.prompt) for other in jobs if other is not job)
        key = tuple(job.prompt[:doc])
        if key in seen:
            hits += min(doc // block, (len(job.prompt) - 1) // block) * block
        seen.add(key)
        queries += len(job.prompt)
    config = EngineConfig(max_model_len=2048, block_size=block, num_gpu_blocks=512)
    async with SimCluster([EngineSpec(port=0, config=config, timing=BASE)]) as cluster:
        got = await run_workload(cluster.urls[0], jobs, concurrency=1)
    assert got.hit_rate == pytest.approx(hits / queries)
    assert got.hit_rate > 0.3


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
