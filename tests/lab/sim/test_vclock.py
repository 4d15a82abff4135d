from __future__ import annotations

import random
import time
import zlib
from collections import Counter
from collections.abc import Sequence

import pytest

from router.balance.least_outstanding import LeastOutstanding
from router.balance.prefix_affinity import PrefixAffinity
from router.lab.sim.config import EngineConfig
from router.lab.sim.timing import StepTimeModel, load_preset
from router.lab.sim.vclock import BackendState, Change, TraceRequest, VirtualBackend, VirtualCluster, simulate

TIMING = StepTimeModel(c0=0.005, c_prefill=1e-4, c_decode=1e-3, c_ctx=1e-6, frontend_s=0.002)
CONFIG = EngineConfig(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=64, num_gpu_blocks=4096)


def backends(n: int, pool: str = "p", config: EngineConfig = CONFIG) -> list[VirtualBackend]:
    return [VirtualBackend(f"http://sim-{pool}-{i}", pool, config, TIMING) for i in range(n)]


def chat(rid: str, t: float, text: str, max_tokens: int = 20, **extra: object) -> TraceRequest:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }
    return TraceRequest(rid, t, body, "chat", label="chat")


def round_robin(states: Sequence[BackendState], req: TraceRequest) -> int:
    return int(req.request_id.rsplit("-", 1)[1]) % len(states)


def test_single_request_follows_the_step_model() -> None:
    res = simulate(backends(1), [chat("r-0", 1.0, "x" * 400, max_tokens=3)], round_robin)
    rec = res.records[0]
    prefill = TIMING.step_time(100, 0, 100)
    assert rec.ttft == pytest.approx(TIMING.frontend_s + prefill)
    decodes = [TIMING.step_time(0, 1, 100 + k) for k in (1, 2)]
    assert list(rec.itl) == pytest.approx(decodes)
    assert rec.e2e == pytest.approx(TIMING.frontend_s + prefill + sum(decodes))
    assert (rec.status, rec.prompt_tokens, rec.output_tokens, rec.finish_reason) == (200, 100, 3, "length")


def test_pick_places_every_request_and_sees_in_flight_counts() -> None:
    seen: list[list[int]] = []

    def pick(states: Sequence[BackendState], req: TraceRequest) -> int:
        seen.append([s.in_flight for s in states])
        return round_robin(states, req)

    trace = [chat(f"r-{i}", 0.001 * i, "hello " * 50, max_tokens=50) for i in range(6)]
    res = simulate(backends(3), trace, pick)
    assert [r.backend for r in res.records] == [0, 1, 2, 0, 1, 2]
    assert seen[3] == [1, 1, 1]  # the first three are still running when the fourth arrives
    assert all(r.status == 200 and r.output_tokens == 50 for r in res.records)


def test_refused_and_invalid_requests_are_recorded_not_run() -> None:
    trace = [
        chat("r-0", 0.0, "fine"),
        TraceRequest("r-1", 0.0, {"model": "other", "messages": [{"role": "user", "content": "x"}]}),
        chat("r-2", 0.0, "too long", max_tokens=9000),
        chat("r-3", 0.0, "refused"),
    ]
    res = simulate(backends(1), trace, lambda s, r: None if r.request_id == "r-3" else 0)
    assert [r.status for r in res.records] == [200, 404, 400, 0]
    assert res.backends[0].generated_tokens == 20


def test_queue_limit_rejects_with_503() -> None:
    cfg = CONFIG.replace(max_num_seqs=1, max_num_queued_reqs=1)
    trace = [chat(f"r-{i}", 0.0, "hi", max_tokens=30) for i in range(4)]
    res = simulate(backends(1, config=cfg), trace, round_robin)
    assert sorted(r.status for r in res.records) == [200, 200, 503, 503]


def test_stream_interval_groups_the_client_visible_gaps() -> None:
    cfg = CONFIG.replace(stream_interval=5)
    res = simulate(backends(1, config=cfg), [chat("r-0", 0.0, "x" * 40, max_tokens=21)], round_robin)
    assert len(res.records[0].itl) == 4  # 20 tokens after the first, in groups of 5


def test_the_routers_balancer_drives_placement() -> None:
    balancer = LeastOutstanding()

    def pick(states: Sequence[BackendState], req: TraceRequest) -> int:
        return balancer.pick(states, None).index

    trace = [chat(f"r-{i}", 0.0005 * i, "q" * 200, max_tokens=200) for i in range(40)]
    res = simulate(backends(4), trace, pick)
    assert set(Counter(r.backend for r in res.records).values()) == {10}


def _rag_trace(n: int, docs: int, seed: int = 3) -> list[TraceRequest]:
    rng = random.Random(seed)
    texts = ["".join(rng.choice("abcdefghij ") for _ in range(6000)) for _ in range(docs)]
    return [
        chat(f"r-{i}", 0.02 * i, texts[rng.randrange(docs)] + f" question {i}?", max_tokens=10)
        for i in range(n)
    ]


def _hit_rate(res_backends: Sequence[object]) -> float:
    hits = sum(b.prefix_hits for b in res_backends)  # type: ignore[attr-defined]
    queries = sum(b.prefix_queries for b in res_backends)  # type: ignore[attr-defined]
    return float(hits / queries)


def test_prefix_affinity_raises_the_prefix_cache_hit_rate() -> None:
    """The router's rendezvous affinity over a prompt fingerprint versus round robin: same
    engines, same trace, only the pick differs."""
    affinity = PrefixAffinity(epsilon=10.0)

    def by_prefix(states: Sequence[BackendState], req: TraceRequest) -> int:
        text = req.body["messages"][0]["content"]
        key = zlib.crc32(text[:1024].encode()).to_bytes(4, "big")
        return affinity.pick(states, key).index

    small_cache = CONFIG.replace(num_gpu_blocks=400, max_model_len=4096)  # ≈4 documents
    trace = _rag_trace(160, docs=12)
    rr = simulate(backends(4, config=small_cache), trace, round_robin)
    aff = simulate(backends(4, config=small_cache), trace, by_prefix)
    assert _hit_rate(aff.backends) > _hit_rate(rr.backends) + 0.2


def test_scraped_load_is_stale_between_scrapes() -> None:
    running: list[int] = []

    def pick(states: Sequence[BackendState], req: TraceRequest) -> int:
        running.append(states[0].num_running)
        return 0

    trace = [chat(f"r-{i}", 0.05 * i, "x" * 40, max_tokens=100) for i in range(4)]
    simulate(backends(1), trace, pick, scrape_interval=10.0)
    assert running == [0, 0, 0, 0]
    running.clear()
    simulate(backends(1), trace, pick, scrape_interval=0.0)
    assert running[1:] == [1, 2, 3]


def test_same_trace_same_result() -> None:
    trace = _rag_trace(40, docs=3)
    a = simulate(backends(2), trace, round_robin)
    b = simulate(backends(2), trace, round_robin)
    assert [(r.first_token, r.finish) for r in a.records] == [(r.first_token, r.finish) for r in b.records]


def test_thousands_of_requests_on_eight_engines_run_fast() -> None:
    """A scaled-down version of the 10,000-request target (measured by router/lab/sim/cost.py)."""
    preset = load_preset("h100-llama3-8b")
    vbs = [VirtualBackend(f"b{i}", "p", preset.engine, preset.timing, (preset.model,)) for i in range(8)]
    rng = random.Random(7)
    trace = []
    t = 0.0
    for i in range(2000):
        t += rng.expovariate(60.0)
        body = {
            "model": preset.model,
            "max_tokens": rng.randint(20, 300),
            "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{i} " + "w" * rng.randint(200, 6000)}],
        }
        trace.append(TraceRequest(f"r-{i}", t, body))
    balancer = LeastOutstanding()
    start = time.process_time()
    res = simulate(vbs, trace, lambda s, r: balancer.pick(s, None).index)
    elapsed = time.process_time() - start
    assert all(r.status == 200 and r.finish is not None for r in res.records)
    assert elapsed < 15.0


@pytest.mark.parametrize("layout", ["paged", "virtual-contiguous", "hybrid-prefix-shared"])
def test_layout_statistic_is_reported_per_backend(layout: str) -> None:
    cfg = CONFIG.replace(kv_layout=layout)
    trace = [chat(f"r-{i}", 0.001 * i, f"{i} " + "z" * 600, max_tokens=300) for i in range(24)]
    res = simulate(backends(1, config=cfg), trace, round_robin)
    summary = res.backends[0]
    assert summary.blocks_per_sequence > 10
    assert 1 <= summary.spans_per_sequence <= summary.blocks_per_sequence
    if layout != "paged":
        assert summary.spans_per_sequence < 3  # contiguous layouts keep sequences in few runs


def test_a_backend_that_leaves_takes_no_new_request_and_one_that_joins_does() -> None:
    trace = [chat(f"r-{i}", 0.1 * i, "x" * 400, max_tokens=3) for i in range(60)]
    seen: list[tuple[float, list[int]]] = []

    def pick(states: Sequence[BackendState], req: TraceRequest) -> int:
        seen.append((req.arrival, [s.index for s in states]))
        return states[int(req.request_id[2:]) % len(states)].index

    changes = (Change(2.0, 2, up=True), Change(3.0, 0, up=False), Change(4.5, 0, up=True))
    cluster = VirtualCluster(backends(3), changes=changes, absent=(2,))
    res = cluster.run(trace, pick)
    assert all(r.status == 200 for r in res.records)
    for t, listed in seen:
        assert (2 in listed) == (t >= 2.0)
        assert (0 in listed) == (not 3.0 <= t < 4.5)
    on_zero = [r.arrival for r in res.records if r.backend == 0]
    assert on_zero and not [t for t in on_zero if 3.0 <= t < 4.5]
    # Every engine that served under a name is counted in its summary, the restarted one too.
    assert sum(b.prefix_queries for b in res.backends) == sum(r.prompt_tokens for r in res.records)
