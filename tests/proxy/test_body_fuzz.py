"""Fuzzing request bodies through a real router in front of a recording backend.

Whatever the body, the router answers it without a 5xx; a backend sees a request only when the
body was valid for the route; and what the backend receives — model, stream flag, output bound —
is exactly what the router judged (its debug headers say what that was)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.request.fields import ENGINE_FIELDS, OPEN_FIELDS
from tests.conftest import Stack, router_stack
from tests.support.fakebackend import Seen
from tests.support.profiles import MODEL, auth, profile


@dataclass
class LiveStack:
    stack: Stack
    client: httpx.Client


@contextlib.contextmanager
def threaded_stack() -> Iterator[LiveStack]:
    """The router and its fake backends served from a thread of their own, so that a synchronous
    property test can send it requests one example at a time."""
    ready: list[Stack] = []
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        def shape(urls: list[str]) -> dict[str, Any]:
            data = profile(urls)
            for lane in data["lanes"].values():
                lane["max_output_tokens"] = 600
            return data

        async with router_stack(shape=shape) as s:
            ready.append(s)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    try:
        assert started.wait(30), "the router did not start"
        with httpx.Client(base_url=ready[0].url, timeout=10) as client:
            yield LiveStack(ready[0], client)
    finally:
        stop.set()
        thread.join(30)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveStack]:
    with threaded_stack() as s:
        yield s


JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELD_NAMES = st.sampled_from(sorted(OPEN_FIELDS["chat"] | OPEN_FIELDS["completions"] | ENGINE_FIELDS))
PARTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "image_embeds", "bogus"])},
    optional={"text": st.text(max_size=300) | JSON_SCALARS},
)
CONTENT = st.one_of(st.text(max_size=2000), st.none(), st.lists(PARTS, max_size=3), JSON_SCALARS)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "wizard"]), "content": CONTENT}
)
BOUND = st.one_of(st.none(), st.integers(min_value=-3, max_value=5000), st.text(max_size=3), st.booleans())


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": draw(st.sampled_from([MODEL, MODEL, "other-model", 7])),
        "messages": draw(st.lists(MESSAGE, max_size=4)),
    }
    for name in ("stream", "max_tokens", "max_completion_tokens", "n"):
        if draw(st.booleans()):
            body[name] = draw(BOUND if name != "stream" else st.one_of(st.booleans(), JSON_SCALARS))
    body.update(draw(st.dictionaries(FIELD_NAMES | st.text(max_size=6), JSON_VALUES, max_size=3)))
    return body


def _forwarded(live: LiveStack) -> int:
    return live.stack.forwarded()


def _last(live: LiveStack) -> Seen:
    return max(live.stack.seen(), key=lambda s: s.started)


def _expected_field(sent: dict[str, Any]) -> str:
    return "max_completion_tokens" if "max_completion_tokens" in sent else "max_tokens"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=chat_bodies())
def test_any_chat_body_is_answered_without_5xx_and_forwarded_only_as_judged(
    live: LiveStack, body: dict[str, Any]
) -> None:
    before = _forwarded(live)
    resp = live.client.post("/v1/chat/completions", content=orjson.dumps(body), headers=auth("user"))

    assert resp.status_code < 500, resp.text
    if resp.status_code != 200:
        assert _forwarded(live) == before, f"{resp.status_code} yet forwarded: {resp.text}"
        assert "error" in resp.json()
        return
    assert _forwarded(live) == before + 1
    sent = orjson.loads(_last(live).body)
    assert sent["model"] == body["model"]
    assert bool(sent.get("stream")) == (body.get("stream") is True)
    judged = int(resp.headers["x-lane-router-max-tokens"])
    field = _expected_field(sent)
    assert sent[field] == judged
    assert {"max_tokens", "max_completion_tokens"} & set(sent) == {field}
    assert judged * (sent.get("n") or 1) <= 600  # the lanes' cap holds however it was asked


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.one_of(st.text(max_size=500), st.lists(st.text(max_size=50), max_size=4), JSON_VALUES),
    extra=st.dictionaries(FIELD_NAMES | st.text(max_size=6), JSON_VALUES, max_size=3),
    max_tokens=BOUND,
)
def test_any_completions_body_is_answered_without_5xx_and_bounded_by_max_tokens(
    live: LiveStack, prompt: Any, extra: dict[str, Any], max_tokens: Any
) -> None:
    body = {"model": MODEL, "prompt": prompt, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    before = _forwarded(live)
    resp = live.client.post("/v1/completions", content=orjson.dumps(body), headers=auth("user"))

    assert resp.status_code < 500, resp.text
    if resp.status_code != 200:
        assert _forwarded(live) == before
        return
    sent = orjson.loads(_last(live).body)
    assert "max_completion_tokens" not in sent
    assert sent["max_tokens"] == int(resp.headers["x-lane-router-max-tokens"])
