"""The lab's seeded request plans: reproducible, and the sizes they claim."""

from __future__ import annotations

import random

import orjson

from router.facts import parse_facts
from router.lanelab import workloads
from router.tokens import SimulatorCounter


def test_text_has_four_characters_a_token() -> None:
    assert len(workloads.text(random.Random(1), 250)) == 1000


def test_plans_are_reproducible_and_in_time_order() -> None:
    a = workloads.long_flood("m", 2.0, 3.0, 10.0)
    b = workloads.long_flood("m", 2.0, 3.0, 10.0)
    assert a == b
    assert [p.at for p in a] == sorted(p.at for p in a)
    assert {p.tag for p in a} == {"long", "short"}


def test_long_and_short_prompts_have_the_planned_sizes() -> None:
    counter = SimulatorCounter()
    for p in workloads.long_flood("m", 2.0, 3.0, 10.0, long_tokens=6000, short_tokens=60):
        tokens = parse_facts("chat", p.body, counter).prompt_tokens
        assert (5990 <= tokens <= 6010) if p.tag == "long" else (tokens < 100)


def test_rag_questions_repeat_documents() -> None:
    plan = workloads.rag("m", 20.0, 10.0, docs=8, doc_tokens=600)
    docs = {orjson.loads(p.body)["messages"][0]["content"] for p in plan}
    assert len(plan) > 100 and len(docs) <= 8


def test_agent_sessions_grow_and_share_the_system_prompt() -> None:
    sessions = workloads.agent_sessions(4, 3, spread_s=5.0)
    assert len({s.system for s in sessions}) == 1
    s = sessions[0]
    steps = [s.messages(i) for i in range(3)]
    assert [len(m) for m in steps] == [2, 4, 6]
    assert steps[2][:4] == steps[1]  # a step re-sends the whole conversation so far
    assert [m["role"] for m in steps[2]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
