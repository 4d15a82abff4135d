"""The lane experiments' seeded request plans: reproducible, and the sizes they claim."""

from __future__ import annotations

import random

import orjson

from router.lab.bench import laneplans
from router.request.facts import parse_facts
from router.request.tokens import SimulatorCounter


def test_text_has_four_characters_a_token() -> None:
    assert len(laneplans.text(random.Random(1), 250)) == 1000


def test_plans_are_reproducible_and_in_time_order() -> None:
    a = laneplans.long_flood("m", 2.0, 3.0, 10.0)
    b = laneplans.long_flood("m", 2.0, 3.0, 10.0)
    assert a == b
    assert [r.arrival for r in a] == sorted(r.arrival for r in a)
    assert {r.cls for r in a} == {"long", "short"}
    assert len({r.request_id for r in a}) == len(a)


def test_long_and_short_prompts_have_the_planned_sizes() -> None:
    counter = SimulatorCounter()
    for r in laneplans.long_flood("m", 2.0, 3.0, 10.0, long_tokens=6000, short_tokens=60):
        tokens = parse_facts("chat", orjson.dumps(r.body), counter).prompt_tokens
        assert (5990 <= tokens <= 6010) if r.cls == "long" else (tokens < 100)


def test_plans_name_no_client() -> None:
    # Without X-Client-Id the router knows a client by its address, as the experiments intend.
    (request, *_) = laneplans.chat("m", 5.0, 2.0)
    assert request.headers == () and not request.slow


def test_rag_questions_repeat_documents() -> None:
    plan = laneplans.rag("m", 20.0, 10.0, docs=8, doc_tokens=600)
    docs = {r.body["messages"][0]["content"] for r in plan}
    assert len(plan) > 100 and len(docs) <= 8


def test_agent_sessions_grow_and_share_the_system_prompt() -> None:
    sessions = laneplans.agent_sessions(4, 3, spread_s=5.0)
    assert len({s.system for s in sessions}) == 1
    s = sessions[0]
    steps = [s.messages(i) for i in range(3)]
    assert [len(m) for m in steps] == [2, 4, 6]
    assert steps[2][:4] == steps[1]  # a step re-sends the whole conversation so far
    assert [m["role"] for m in steps[2]] == ["system", "user", "assistant", "tool", "assistant", "tool"]


def test_a_session_plan_sends_its_steps_in_turn_with_its_header() -> None:
    (session,) = laneplans.agent_sessions(1, 3, spread_s=1.0)
    plan = session.plan("m", think_s=0.5, max_tokens=8, session_header=True)
    assert [step.step for step in plan.steps] == [0, 1, 2]
    assert {step.cls for step in plan.steps} == {"agent"}
    assert all(step.headers == (("x-session-id", session.name),) for step in plan.steps)
    assert [len(step.body["messages"]) for step in plan.steps] == [2, 4, 6]
    assert not session.plan("m", think_s=0.5, max_tokens=8, session_header=False).steps[0].headers
