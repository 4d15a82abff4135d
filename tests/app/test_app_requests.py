"""Bad input is refused before anything is forwarded; each class is reached by its signal."""

from __future__ import annotations

import pytest

from tests.conftest import Stack
from tests.support.profiles import MODEL, auth

MSG = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'{"model": "fake-model", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "invalid_json"),
        (b'{"messages": []}', "invalid_model"),
        (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', "invalid_model"),
        (b'{"model": "fake-model", "messages": "hi"}', "invalid_messages"),
        (b'{"model": "fake-model", "messages": [{"role": "wizard", "content": "x"}]}', "invalid_messages"),
        (b'{"model": "fake-model", "messages": [{"role": "user", "content": 5}]}', "invalid_messages"),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "invalid_stream",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
            "invalid_max_tokens",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
            "invalid_max_tokens",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "tools": {}}',
            "invalid_tools",
        ),
        (b"", "invalid_json"),
    ],
)
async def test_malformed_bodies_get_400_and_reach_no_backend(stack: Stack, body: bytes, code: str) -> None:
    async with stack.client() as client:
        resp = await client.post(
            "/v1/chat/completions", content=body, headers={**auth("user"), "content-type": "application/json"}
        )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code
    assert stack.forwarded() == 0, [(s.method, s.path, s.body[:80]) for s in stack.seen()]


async def test_a_10_mb_body_gets_413_and_reaches_no_backend(stack: Stack) -> None:
    huge = b'{"model": "fake-model", "prompt": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    async with stack.client() as client:
        declared = await client.post("/v1/completions", content=huge, headers=auth("user"))

        async def chunked():  # type: ignore[no-untyped-def]
            for i in range(0, len(huge), 1 << 20):
                yield huge[i : i + (1 << 20)]

        undeclared = await client.post("/v1/completions", content=chunked(), headers=auth("user"))
    for resp in (declared, undeclared):
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "payload_too_large"
    assert stack.forwarded() == 0, [(s.method, s.path, s.body[:80]) for s in stack.seen()]


async def _class_of(
    stack: Stack, body: dict[str, object], key: str = "user", **headers: str
) -> tuple[str, str]:
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=body, headers={**auth(key), **headers})
    assert resp.status_code == 200, resp.text
    return resp.headers["x-lane-router-class"], resp.headers["x-lane-router-reason"]


async def test_each_class_is_reached_by_its_signal(stack: Stack) -> None:
    base = {"model": MODEL, "messages": MSG, "stream": True, "max_tokens": 16}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    long_text = "word " * 1200  # ≈1,500 estimated tokens, above the test profile's 1,000
    document = "The same retrieved document. " * 20  # ≈150 tokens of shared prefix, above 64

    assert await _class_of(stack, base) == ("chat", "default")
    assert await _class_of(stack, {**base, "tools": tools}) == ("agent", "tools")
    tool_turn = [
        *MSG,
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "42"},
    ]
    assert await _class_of(stack, {**base, "messages": tool_turn}) == ("agent", "tools")
    assert await _class_of(stack, {**base, "messages": [{"role": "user", "content": long_text}]}) == (
        "long_context",
        "long_prompt",
    )
    rag = [{"role": "user", "content": document + f" question {i}"} for i in range(3)]
    got = [await _class_of(stack, {**base, "messages": [m]}) for m in rag]
    assert got == [("chat", "default"), ("chat", "default"), ("rag", "repeated_prefix")]
    assert await _class_of(stack, {**base, "stream": False, "max_tokens": 800}) == (
        "batch",
        "large_generation",
    )
    assert await _class_of(stack, base, key="nightly") == ("batch", "pinned_key")
    assert await _class_of(stack, base, key="tester", **{"x-request-class": "slow_stream"}) == (
        "slow_stream",
        "header",
    )
    # The header is a privilege: an ordinary key's header is ignored.
    assert await _class_of(stack, base, key="user", **{"x-request-class": "slow_stream"}) == (
        "chat",
        "default",
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"chat_template_kwargs": {"custom_tools": [{"name": "f", "description": "x" * 5000}]}},
        {"chat_template_kwargs": {"documents": [{"title": "t", "text": "x" * 5000}]}},
        {"documents": [{"title": "t", "text": "x" * 5000}]},
    ],
    ids=["custom-tools", "kwargs-documents", "documents"],
)
async def test_what_the_template_renders_makes_a_long_prompt(stack: Stack, fields: dict[str, object]) -> None:
    # A short message; the template's other inputs carry ≈5,000 tokens, above the profile's 1,000.
    body = {"model": MODEL, "messages": MSG, "stream": True, "max_tokens": 16, **fields}
    assert await _class_of(stack, body) == ("long_context", "long_prompt")
