from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import orjson
import pytest

from router.lab.bench.generate import CLIENT_HEADER, Request, SessionPlan, generate
from router.lab.bench.workload import WorkloadSpec, load_workload
from router.request.tokens import CHARS_PER_TOKEN, estimate_messages_tokens

ROOT = Path(__file__).resolve().parents[3]
SPEC = load_workload(ROOT / "config/workloads/mixed-six.yaml")
MODEL = "m"


@pytest.fixture(scope="module")
def big() -> list[Request]:
    return list(generate(SPEC, model=MODEL, rate=40, duration=300).requests())


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a = generate(SPEC, model=MODEL, rate=10, duration=30)
    b = generate(SPEC, model=MODEL, rate=10, duration=30)
    c = generate(SPEC, model=MODEL, rate=10, duration=30, seed=SPEC.seed + 1)
    assert a.digest() == b.digest()
    assert a.digest() != c.digest()
    assert [r.body for r in a.requests()] == [r.body for r in b.requests()]


def test_another_load_sends_the_same_requests_scaled_in_time() -> None:
    slow = generate(SPEC, model=MODEL, rate=5, duration=60)
    fast = generate(SPEC, model=MODEL, rate=10, duration=30)
    assert [r.request_id for r in slow.requests()] == [r.request_id for r in fast.requests()]
    pairs = list(zip(slow.requests(), fast.requests(), strict=True))
    assert all(a.body == b.body for a, b in pairs)
    assert all(a.arrival == pytest.approx(2 * b.arrival) for a, b in pairs)


def test_class_shares_follow_the_workload(big: list[Request]) -> None:
    counts = Counter(r.cls for r in big)
    for name in SPEC.class_names():
        share = counts[name] / len(big)
        assert share == pytest.approx(SPEC.spec(name).share, abs=0.02), name


def test_arrivals_are_poisson_at_the_offered_rate() -> None:
    trace = generate(SPEC, model=MODEL, rate=40, duration=300)
    assert trace.request_count / 300 == pytest.approx(40, rel=0.05)
    starts = sorted(i.arrival for i in trace.items)
    assert starts == [i.arrival for i in trace.items] and starts[0] >= 0 and starts[-1] < 300


def test_token_counts_stay_in_range_and_match_the_text(big: list[Request]) -> None:
    for r in big:
        spec = SPEC.spec(r.cls)
        assert spec.output_tokens.low <= r.body["max_tokens"] == r.output_tokens <= spec.output_tokens.high
        # What the engine counts is exactly what the generator meant.
        assert estimate_messages_tokens(r.body["messages"]) == r.prompt_tokens
        if spec.prompt_tokens is not None:
            assert spec.prompt_tokens.low <= r.prompt_tokens <= spec.prompt_tokens.high
        assert r.body["ignore_eos"] is True and r.body["stream"] is spec.stream
        assert r.body["model"] == MODEL


def test_rag_repeats_a_few_documents_zipf_first(big: list[Request]) -> None:
    rag = [r for r in big if r.cls == "rag"]
    heads = Counter(r.body["messages"][0]["content"][: 3000 * CHARS_PER_TOKEN] for r in rag)
    assert len(heads) <= 20
    (top, n_top), *_ = heads.most_common()
    assert top.startswith("Document 1. ") and n_top > len(rag) / 5
    assert all(3030 <= r.prompt_tokens <= 3080 for r in rag)


def test_prompts_other_than_rag_share_no_prefix(big: list[Request]) -> None:
    firsts = Counter(
        r.body["messages"][-1 if r.cls != "agent" else 1]["content"][:256]
        for r in big
        if r.cls != "rag" and r.step == 0
    )
    assert firsts.most_common(1)[0][1] == 1


def test_agent_sessions_grow_with_tool_calls_and_results() -> None:
    trace = generate(SPEC, model=MODEL, rate=40, duration=60)
    sessions = [i for i in trace.items if isinstance(i, SessionPlan)]
    assert sessions
    for plan in sessions:
        steps = plan.steps
        assert 3 <= len(steps) <= 8 and steps[0].prompt_tokens == 1500
        for k, (a, b) in enumerate(itertools.pairwise(steps)):
            assert b.body["messages"][: len(a.body["messages"])] == a.body["messages"]
            added = b.body["messages"][len(a.body["messages"]) :]
            assert [m["role"] for m in added] == ["assistant", "tool"]
            assert added[0]["tool_calls"][0]["function"]["name"] in {
                t["function"]["name"] for t in a.body["tools"]
            }
            assert 200 <= b.prompt_tokens - a.prompt_tokens - a.output_tokens <= 800
            assert 0.5 <= b.think_s <= 2.0 and b.step == k + 1
        assert all(s.body["stream"] is False and s.body["tools"] for s in steps)


def test_slow_readers_are_a_fixed_population_with_fixed_speeds(big: list[Request]) -> None:
    slow = [r for r in big if r.cls == "slow_stream"]
    speeds: dict[str, set[float]] = {}
    for r in slow:
        speeds.setdefault(r.client_id, set()).add(r.read_rate or 0.0)
    assert 1 < len(speeds) <= 24
    assert all(len(s) == 1 and 4.0 <= next(iter(s)) <= 8.0 for s in speeds.values())
    assert all(r.read_rate is None for r in big if r.cls != "slow_stream")


def test_requests_carry_no_class_label(big: list[Request]) -> None:
    for r in big[:500]:
        text = orjson.dumps(r.body).decode() + str(r.headers)
        assert [h for h, _ in r.headers] == [CLIENT_HEADER]
        assert r.cls not in r.client_id
        for name in ("slow", "batch", "long_context", "x-request-class"):
            assert name not in text.lower()


def test_a_workload_may_leave_classes_out() -> None:
    data = SPEC.model_dump(mode="json")
    data["classes"] = {"chat": {**data["classes"]["chat"], "share": 1.0}}
    spec = WorkloadSpec.model_validate(data)
    trace = generate(spec, model=MODEL, rate=10, duration=10)
    assert {r.cls for r in trace.requests()} == {"chat"}


def test_rag_instructions_come_before_every_document_the_same() -> None:
    spec = load_workload(ROOT / "config/workloads/prefix-rag.yaml")
    docs = spec.spec("rag").documents
    assert docs is not None and docs.instructions > 0
    rag = list(generate(spec, model=MODEL, rate=10, duration=20).requests())
    systems = {r.body["messages"][0]["content"] for r in rag}
    assert len(systems) == 1 and all(r.body["messages"][0]["role"] == "system" for r in rag)
    assert estimate_messages_tokens([rag[0].body["messages"][0]]) == docs.instructions
    assert all(estimate_messages_tokens(r.body["messages"]) == r.prompt_tokens for r in rag)
    assert len({r.body["messages"][1]["content"][:1000] for r in rag}) > 1  # then the documents
