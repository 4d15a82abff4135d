"""Seeded request plans for the lane-policy experiments, as requests of the harness
(`router.lab.bench.generate.Request`) that `run_realtime` sends.

Text is made of 4-character words, so the router's estimate (4 characters a token) and the
simulator's tokenizer agree on every prompt length. Every request streams, ignores EOS (so it
generates exactly max_tokens) and asks for the usage event. No request names a client: the
router knows each by its address, as it would a client without `X-Client-Id`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from router.lab.bench.generate import Request, SessionPlan

_WORDS = tuple(f" {a}{b}{c}" for a in "bcdfghklmnprst" for b in "aeiou" for c in "bdgklmnprst")
TOOLS = ({"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}},)


def text(rng: random.Random, tokens: int) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(tokens))


def body(model: str, messages: list[dict[str, str]], max_tokens: int, **extra: object) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        **extra,
    }


def planned(tag: str, n: int, at: float, payload: dict[str, Any], prompt_tokens: int) -> Request:
    """Request `n` of a plan's `tag`: the tag is its class in the outcomes."""
    output = payload["max_tokens"]
    return Request(
        request_id=f"{tag}-{n}",
        cls=tag,
        arrival=at,
        body=payload,
        client_id="",
        stream=True,
        prompt_tokens=prompt_tokens,
        output_tokens=output,
    )


def poisson(rng: random.Random, rate: float, duration: float) -> list[float]:
    times, t = [], rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def rag(
    model: str,
    rate: float,
    duration: float,
    *,
    docs: int = 32,
    doc_tokens: int = 2000,
    skew: float = 0.0,
    seed: int = 1,
) -> list[Request]:
    """Questions about `docs` long documents (popularity ~ 1/rank^skew; 0: all alike): the
    document is a repeated prefix, the question a short new suffix."""
    rng = random.Random(seed)
    library = [text(rng, doc_tokens) for _ in range(docs)]
    weights = [1 / (i + 1) ** skew for i in range(docs)]
    out = []
    for n, t in enumerate(poisson(rng, rate, duration)):
        doc = rng.choices(library, weights)[0]
        messages = [
            {"role": "system", "content": "Answer from the document.\n" + doc},
            {"role": "user", "content": "Question:" + text(rng, 20)},
        ]
        out.append(planned("rag", n, t, body(model, messages, 24), doc_tokens + 30))
    return out


@dataclass
class Session:
    """An agent loop: each step re-sends the whole conversation plus the last tool result."""

    name: str
    start: float
    system: str
    steps: list[tuple[str, str]] = field(default_factory=list)  # (user/tool text, assistant reply)

    def messages(self, step: int) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.system}]
        for i in range(step + 1):
            prompt, reply = self.steps[i]
            out.append({"role": "user" if i == 0 else "tool", "content": prompt})
            if i < step:
                out.append({"role": "assistant", "content": reply})
        return out

    def plan(self, model: str, *, think_s: float, max_tokens: int, session_header: bool) -> SessionPlan:
        """The session as the harness runs it: each step `think_s` after the previous answer,
        with `X-Session-Id` when `session_header`."""
        headers = (("x-session-id", self.name),) if session_header else ()
        steps = []
        for i in range(len(self.steps)):
            payload = body(model, self.messages(i), max_tokens, tools=list(TOOLS))
            step = planned(
                self.name, i, self.start, payload, sum(len(m["content"]) for m in self.messages(i)) // 4
            )
            steps.append(
                replace(step, cls="agent", session=self.name, step=i, think_s=think_s, extra_headers=headers)
            )
        return SessionPlan(self.name, "agent", self.start, tuple(steps))


def agent_sessions(
    n: int, steps: int, *, spread_s: float, system_tokens: int = 1200, step_tokens: int = 500, seed: int = 2
) -> list[Session]:
    """`n` sessions sharing one long system prompt (tools, instructions), starting over
    `spread_s`; each step adds a tool result of `step_tokens` and a short reply."""
    rng = random.Random(seed)
    system = "You are an agent with tools." + text(rng, system_tokens)
    sessions = []
    for i in range(n):
        s = Session(f"agent-{i}", rng.uniform(0, spread_s), system)
        s.steps = [(f"task {i}:" + text(rng, step_tokens), text(rng, 40)) for _ in range(steps)]
        sessions.append(s)
    return sessions


def long_flood(
    model: str,
    long_rate: float,
    short_rate: float,
    duration: float,
    *,
    long_tokens: int = 6000,
    short_tokens: int = 60,
    seed: int = 3,
) -> list[Request]:
    """Long prompts (few output tokens) arriving steadily, with short interactive prompts."""
    rng = random.Random(seed)
    out = [
        planned(
            "long", n, t, body(model, [{"role": "user", "content": text(rng, long_tokens)}], 8), long_tokens
        )
        for n, t in enumerate(poisson(rng, long_rate, duration))
    ]
    out += [
        planned(
            "short",
            n,
            t,
            body(model, [{"role": "user", "content": text(rng, short_tokens)}], 16),
            short_tokens,
        )
        for n, t in enumerate(poisson(rng, short_rate, duration))
    ]
    return in_time_order(out)


def chat(
    model: str, rate: float, duration: float, *, max_tokens: int = 200, tag: str = "chat", seed: int = 4
) -> list[Request]:
    rng = random.Random(seed)
    return [
        planned(tag, n, t, body(model, [{"role": "user", "content": text(rng, 80)}], max_tokens), 80)
        for n, t in enumerate(poisson(rng, rate, duration))
    ]


def in_time_order(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: r.arrival)
