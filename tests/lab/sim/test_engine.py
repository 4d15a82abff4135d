from __future__ import annotations

import pytest

from router.errors import Unavailable
from router.lab.sim.config import EngineConfig
from router.lab.sim.engine import Engine, StepResult
from router.lab.sim.request import Status, new_request, planned_output
from router.lab.sim.timing import StepTimeModel

from .enginehelp import TIMING, engine, prompt, req, run


def test_single_request_timeline_follows_the_step_model() -> None:
    e = engine()
    r = req("a", 100, 5)
    steps: list[StepResult] = []
    end = run(e, [r], on_step=steps.append)
    first = TIMING.step_time(100, 0, 100)
    assert steps[0].prefill_tokens == 100 and steps[0].duration == pytest.approx(first)
    assert r.first_token_time == pytest.approx(first)
    # Each decode attends to the whole context so far.
    decode = [TIMING.step_time(0, 1, 100 + k) for k in range(1, 5)]
    assert [s.duration for s in steps[1:]] == pytest.approx(decode)
    assert end == pytest.approx(first + sum(decode))
    assert r.num_output_tokens == 5 and r.finish_reason == "length"
    assert e.kv.num_used_blocks == 0 and not e.has_work


def test_running_decodes_are_scheduled_before_a_new_prefill() -> None:
    e = engine(max_num_batched_tokens=64)
    a, b = req("a", 16, 20), req("b", 16, 20)
    run_until = [a, b]
    for r in run_until:
        e.add_request(r, 0.0)
    e.step(0.0)  # both prefill
    late = req("late", 1000, 2)
    e.add_request(late, 0.0)
    res = e.step(1.0)
    assert res is not None
    assert res.decode_seqs == 2
    assert res.prefill_tokens == 62  # the rest of the budget goes to the new prompt


def test_chunked_prefill_splits_a_long_prompt_by_the_budget() -> None:
    e = engine(max_num_batched_tokens=512)
    r = req("long", 2000, 1)
    steps: list[StepResult] = []
    run(e, [r], on_step=steps.append)
    assert [s.prefill_tokens for s in steps] == [512, 512, 512, 464]
    assert r.first_token_time == pytest.approx(sum(s.duration for s in steps))


def test_long_prefill_threshold_caps_each_chunk() -> None:
    e = engine(max_num_batched_tokens=2048, long_prefill_token_threshold=300)
    steps: list[StepResult] = []
    run(e, [req("long", 1000, 1)], on_step=steps.append)
    assert [s.prefill_tokens for s in steps] == [300, 300, 300, 100]


def test_without_chunked_prefill_a_prompt_runs_whole_in_one_step() -> None:
    e = engine(max_num_batched_tokens=4096, enable_chunked_prefill=False)
    steps: list[StepResult] = []
    run(e, [req("long", 3000, 1)], on_step=steps.append)
    assert [s.prefill_tokens for s in steps] == [3000]


def test_prefix_cache_hit_skips_prefill_work() -> None:
    e = engine(max_num_batched_tokens=4096)
    first, second = req("a", 1000, 1, tag=7), req("b", 1000, 1, tag=7, t=1.0)
    steps: list[StepResult] = []
    run(e, [first, second], on_step=steps.append)
    assert steps[0].prefill_tokens == 1000
    # 62 full blocks cached; at least the last prompt token is recomputed.
    assert steps[1].prefill_tokens == 1000 - 992
    assert second.num_cached_tokens == 992
    assert e.scheduler.prefix_hits == 992 and e.scheduler.prefix_queries == 2000
    assert second.first_token_time is not None and first.first_token_time is not None
    assert second.first_token_time - second.arrival_time < first.first_token_time


def test_prefix_caching_disabled_recomputes_everything() -> None:
    e = engine(max_num_batched_tokens=4096, enable_prefix_caching=False)
    steps: list[StepResult] = []
    run(e, [req("a", 1000, 1, tag=7), req("b", 1000, 1, tag=7, t=1.0)], on_step=steps.append)
    assert [s.prefill_tokens for s in steps] == [1000, 1000]


def test_admission_waits_for_free_blocks() -> None:
    # 64 blocks of 16 = 1024 tokens: the second prompt cannot start until the first is done.
    e = engine(num_gpu_blocks=64, max_model_len=1024, max_num_batched_tokens=2048)
    a, b = req("a", 700, 3), req("b", 700, 3)
    run(e, [a, b])
    assert b.scheduled_time is not None and a.finish_time is not None
    assert b.scheduled_time >= a.finish_time
    assert e.scheduler.preemptions == 0


def test_preemption_by_recompute_when_decodes_run_out_of_blocks() -> None:
    e = engine(num_gpu_blocks=20, max_model_len=320, max_num_batched_tokens=512)
    a, b = req("a", 100, 150), req("b", 100, 150)
    preempted: list[str] = []
    run(e, [a, b], on_step=lambda s: preempted.extend(r.request_id for r in s.preempted))
    assert preempted and preempted[0] == "b"  # fcfs: the last admitted goes
    assert e.scheduler.preemptions >= 1
    assert a.num_output_tokens == 150 and b.num_output_tokens == 150
    assert b.num_preemptions >= 1
    # Recompute reads the request's own freed blocks back from the prefix cache.
    assert e.scheduler.prefix_hits > 0
    assert e.kv.num_used_blocks == 0


def test_priority_policy_admits_and_preempts_by_priority() -> None:
    e = engine(max_num_seqs=1, scheduling_policy="priority")
    low, high = req("low", 16, 2, priority=5), req("high", 16, 2, priority=0)
    e.add_request(low, 0.0)
    e.add_request(high, 0.0)
    res = e.step(0.0)
    assert res is not None and list(r.request_id for r in res.outputs) == ["high"]


def test_priority_preemption_picks_the_lowest_priority() -> None:
    e = engine(num_gpu_blocks=20, max_model_len=320, scheduling_policy="priority")
    urgent = req("urgent", 100, 150, priority=0)
    lax = req("lax", 100, 150, priority=9)
    preempted: list[str] = []
    e.add_request(lax, 0.0)
    e.add_request(urgent, 0.0)
    run(e, [], on_step=lambda s: preempted.extend(r.request_id for r in s.preempted))
    assert preempted and set(preempted) == {"lax"}


def test_fcfs_admits_in_arrival_order() -> None:
    e = engine(max_num_seqs=1)
    rs = [req(f"r{i}", 16, 2, t=0.0) for i in range(4)]
    run(e, rs)
    times = [r.scheduled_time for r in rs]
    assert times == sorted(times)  # type: ignore[type-var]


def test_queue_limit_rejects_with_503() -> None:
    e = engine(max_num_queued_reqs=2)
    e.add_request(req("a", 16, 2), 0.0)
    e.add_request(req("b", 16, 2), 0.0)
    with pytest.raises(Unavailable) as info:
        e.add_request(req("c", 16, 2), 0.0)
    assert info.value.status == 503
    e.step(0.0)  # both admitted: the queue has room again
    e.add_request(req("c", 16, 2), 0.0)


def test_max_num_seqs_bounds_the_running_batch() -> None:
    e = engine(max_num_seqs=3)
    for i in range(6):
        e.add_request(req(f"r{i}", 16, 10), 0.0)
    e.step(0.0)
    assert e.num_running == 3 and e.num_waiting == 3


def test_abort_frees_blocks_and_counts() -> None:
    e = engine()
    r = req("a", 300, 50)
    e.add_request(r, 0.0)
    e.step(0.0)
    assert e.kv.num_used_blocks > 0
    assert e.abort("a", 0.5)
    assert e.kv.num_used_blocks == 0 and not e.has_work
    assert r.finish_reason == "abort" and r.status == Status.FINISHED
    assert e.metrics.success["abort"] == 1
    assert not e.abort("a", 0.6)


def test_partial_prefill_limits_let_a_short_prompt_past_long_ones() -> None:
    common = dict(max_num_batched_tokens=4096, long_prefill_token_threshold=256)
    limited = engine(max_num_partial_prefills=2, max_long_partial_prefills=1, **common)
    long1, long2, short = req("l1", 3000, 5), req("l2", 3000, 5), req("s", 100, 5)
    for r in (long1, long2, short):
        limited.add_request(r, 0.0)
    res = limited.step(0.0)
    assert res is not None
    assert limited.num_running == 2  # l1 (long) and s (short); l2 waits for the long slot
    assert {r.request_id for r in limited.scheduler.running} == {"l1", "s"}
    unlimited = engine(**common)
    for r in (req("l1", 3000, 5), req("l2", 3000, 5), req("s", 100, 5)):
        unlimited.add_request(r, 0.0)
    unlimited.step(0.0)
    assert unlimited.num_running == 3


def test_default_long_threshold_with_partial_prefills_is_four_percent() -> None:
    cfg = EngineConfig(
        max_model_len=10000,
        max_num_batched_tokens=2048,
        max_num_partial_prefills=4,
        max_long_partial_prefills=1,
    )
    assert cfg.effective_long_prefill_threshold == 400
    assert EngineConfig().effective_long_prefill_threshold == 0


def test_config_rejects_what_vllm_rejects() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_batched_tokens=8, max_num_seqs=16)
    with pytest.raises(ValueError, match="chunked prefill"):
        EngineConfig(max_model_len=8192, max_num_batched_tokens=2048, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        EngineConfig(max_model_len=1024, long_prefill_token_threshold=2048, num_gpu_blocks=128)
    with pytest.raises(ValueError, match="max_long_partial_prefills"):
        EngineConfig(max_num_partial_prefills=1, max_long_partial_prefills=2)
    with pytest.raises(ValueError, match="stream_interval"):
        EngineConfig(stream_interval=0)


def test_output_length_planning() -> None:
    assert planned_output(max_tokens=40, min_tokens=0, ignore_eos=True, seed=3) == (40, "length")
    lengths = {
        planned_output(max_tokens=10_000, min_tokens=0, ignore_eos=False, seed=s)[0] for s in range(50)
    }
    assert len(lengths) > 10  # seeded, not constant
    n, reason = planned_output(max_tokens=10_000, min_tokens=5000, ignore_eos=False, seed=1)
    assert n >= 5000 and reason == "stop"
    n, reason = planned_output(max_tokens=3, min_tokens=0, ignore_eos=False, seed=1)
    assert n <= 3
    a = new_request("x", prompt(1, 50), max_tokens=500)
    b = new_request("y", prompt(1, 50), max_tokens=500)
    c = new_request("z", prompt(2, 50), max_tokens=500, seed=99)
    assert (a.output_len, a.seed) == (b.output_len, b.seed)
    assert c.seed != a.seed


def test_same_trace_twice_gives_identical_timelines() -> None:
    def once() -> list[tuple[str, float | None, float | None]]:
        e = engine(num_gpu_blocks=40, max_model_len=640)
        rs = [req(f"r{i}", 50 + 37 * i, 30 + i, t=0.01 * i) for i in range(12)]
        run(e, rs)
        return [(r.request_id, r.first_token_time, r.finish_time) for r in rs]

    assert once() == once()


def test_kv_usage_and_metrics_text_use_vllm_names() -> None:
    e = engine()
    e.add_request(req("a", 64, 10), 0.0)
    e.step(0.0)
    text = e.render_metrics("m")
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:request_queue_time_seconds_sum",
        "vllm:e2e_request_latency_seconds_bucket",
        'vllm:request_success_total{engine="0",model_name="m",finished_reason="length"}',
        "vllm:cache_config_info",
    ):
        assert name in text
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 1.0' in text
    assert e.kv_usage == pytest.approx(4 / 1024)  # the sampled token enters KV next step


def _decode_itl_spike_and_long_ttft(budget: int) -> tuple[float, float]:
    """8 streams decoding; a 3,000-token prompt arrives. Returns (largest gap between two
    tokens of a decoding stream while the prompt is prefilled, the prompt's TTFT)."""
    e = Engine(
        EngineConfig(max_model_len=8192, max_num_batched_tokens=budget, max_num_seqs=64, num_gpu_blocks=4096),
        TIMING,
    )
    streams = [req(f"s{i}", 64, 400, t=0.0) for i in range(8)]
    long = req("long", 3000, 1, t=0.2)
    gaps: list[float] = []
    last: dict[str, float] = {}

    def watch(step: StepResult) -> None:
        for r in step.outputs:
            if r.request_id.startswith("s"):
                prefilling = long.first_token_time is None or step.end <= long.first_token_time
                if r.request_id in last and prefilling and step.start >= 0.2:
                    gaps.append(step.end - last[r.request_id])
                last[r.request_id] = step.end

    run(e, [*streams, long], on_step=watch)
    assert long.first_token_time is not None
    return max(gaps), long.first_token_time - long.arrival_time


def test_chunked_prefill_trade_off() -> None:
    """A long prompt arriving during decodes raises their ITL; a smaller token budget lowers
    that spike and raises the long prompt's TTFT."""
    baseline = TIMING.step_time(0, 8, 8 * 200)
    big_spike, big_ttft = _decode_itl_spike_and_long_ttft(4096)
    small_spike, small_ttft = _decode_itl_spike_and_long_ttft(512)
    assert big_spike > 2 * baseline  # the prompt's prefill lands inside decode steps
    assert small_spike < big_spike
    assert small_ttft > big_ttft


def test_prefill_attention_pairs_are_causal_per_chunk() -> None:
    # Only the attention term: each step costs its chunk's (query, earlier key) pairs.
    attention_only = StepTimeModel(c0=0.0, c_prefill=0.0, c_decode=0.0, c_ctx=0.0, c_attn=1e-6)
    config = EngineConfig(max_model_len=4096, max_num_batched_tokens=512, num_gpu_blocks=1024)
    steps: list[StepResult] = []
    run(Engine(config, attention_only), [req("long", 2000, 1)], on_step=steps.append)
    chunks = [(0, 512), (512, 512), (1024, 512), (1536, 464)]
    assert [s.duration for s in steps] == pytest.approx([1e-6 * (n * c + n * (n + 1) / 2) for c, n in chunks])
    # Chunking moves the pairs between steps but computes each of them once.
    assert sum(s.duration for s in steps) == pytest.approx(1e-6 * 2000 * 2001 / 2)
    assert attention_only.prefill_time(2000) == pytest.approx(1e-6 * 2000 * 2001 / 2)


def test_a_prefix_cache_hit_leaves_only_the_new_tokens_pairs() -> None:
    attention_only = StepTimeModel(c0=0.0, c_prefill=0.0, c_decode=0.0, c_ctx=0.0, c_attn=1e-6)
    config = EngineConfig(max_model_len=4096, max_num_batched_tokens=4096, num_gpu_blocks=1024)
    e = Engine(config, attention_only)
    steps: list[StepResult] = []
    run(e, [req("a", 1000, 1, tag=3), req("b", 1000, 1, tag=3, t=1.0)], on_step=steps.append)
    # The second prompt finds 62 full blocks of 16 cached: 8 tokens left, each attending to the
    # 992 cached ones and to the new ones before it.
    assert steps[-1].duration == pytest.approx(1e-6 * (8 * 992 + 8 * 9 / 2))
