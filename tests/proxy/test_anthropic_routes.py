"""The Anthropic routes on raw sockets: their error envelope at every status the router answers
with, before and within a stream, and where the key is read from (`x-api-key` beside
`Authorization`, each at most once, never two different keys)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from router.keys.auth import hash_key
from tests.conftest import Stack, router_stack
from tests.support.anthropicapi import MESSAGES_KEY, messages_profile, sse_events
from tests.support.fakebackend import Behaviour
from tests.support.profiles import KEYS, MODEL, UPSTREAM_KEY

BODY = orjson.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
LIMITED_KEY = "limited-messages-key-0123456789"


def _shape(urls: list[str]) -> dict[str, Any]:
    data = messages_profile(urls)
    data["keys"].append(
        {"name": "limited", "sha256": hash_key(LIMITED_KEY), "routes": ["messages"], "rpm": 1}
    )
    data["lanes"]["chat"].update(max_in_flight=1, queue_limit=0)
    return data


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with router_stack(n_backends=1, shape=_shape) as s:
        yield s


async def _raw(
    url: str, lines: list[str], body: bytes = BODY, path: str = "/v1/messages", method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    """One request of exactly these header lines; its status, headers and body (to EOF)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {len(body)}\r\n"
        head += "connection: close\r\n"
        writer.write((head + "".join(f"{line}\r\n" for line in lines) + "\r\n").encode() + body)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head_bytes, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head_bytes.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    if headers.get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return int(status_line.split()[1]), headers, rest


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + data[:n], data[n + 2 :]
    return out


def _error(status: int, body: bytes, kind: str) -> str:
    """The message of an Anthropic error envelope of `kind`; fails on any other shape."""
    data = orjson.loads(body)
    assert set(data) == {"type", "error"} and data["type"] == "error", (status, data)
    assert set(data["error"]) == {"type", "message"} and data["error"]["type"] == kind, (status, data)
    return str(data["error"]["message"])


KEY = f"x-api-key: {MESSAGES_KEY}"


async def test_errors_before_the_response_in_anthropics_envelope(stack: Stack) -> None:
    url = stack.url
    cases = [
        (400, "invalid_request_error", await _raw(url, [KEY], b"{not json")),
        (401, "authentication_error", await _raw(url, ["x-api-key: wrong"])),
        (403, "permission_error", await _raw(url, [f"authorization: Bearer {KEYS['user']}"])),
        (404, "not_found_error", await _raw(url, [KEY], BODY.replace(MODEL.encode(), b"nope"))),
        (404, "not_found_error", await _raw(url, [KEY], path="/v1/messages/batches")),
        (405, "invalid_request_error", await _raw(url, [KEY], b"", method="GET")),
    ]
    huge = b'{"model": "fake-model", "system": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    cases.append((413, "request_too_large", await _raw(url, [KEY], huge)))
    for status, kind, (got, _, body) in cases:
        assert got == status, (status, body)
        _error(status, body, kind)
    assert stack.forwarded() == 0


async def test_rate_limit_and_a_full_lane_in_anthropics_envelope(stack: Stack) -> None:
    url = stack.url
    limited = [f"x-api-key: {LIMITED_KEY}"]
    assert (await _raw(url, limited))[0] == 200
    status, headers, body = await _raw(url, limited)
    assert status == 429 and "retry-after" in headers
    _error(status, body, "rate_limit_error")
    # One request holds the lane's one slot: the next finds no room (503, overloaded).
    release = asyncio.Event()
    backend = stack.backends[0]
    backend.behaviour = Behaviour(tokens=2, hold=release)
    held = asyncio.ensure_future(_raw(url, [KEY]))
    await backend.wait_for(lambda: len(backend.seen) == 2)
    status, _, body = await _raw(url, [KEY])
    release.set()
    assert (await held)[0] == 200
    assert status == 503
    _error(status, body, "overloaded_error")


def _reset_at(value: str) -> float:
    """An Anthropic reset header's time (RFC 3339, UTC, whole seconds) as seconds since the epoch."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


async def test_a_limited_key_gets_anthropics_rate_limit_headers() -> None:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = messages_profile(urls)
        limits = {"rpm": 2, "tpm": 6000}
        data["keys"].append(
            {"name": "metered", "sha256": hash_key(LIMITED_KEY), "routes": ["messages"], **limits}
        )
        return data

    async with router_stack(n_backends=1, shape=shape) as stack:
        began = time.time()
        admitted = [await _raw(stack.url, [f"x-api-key: {LIMITED_KEY}"]) for _ in range(2)]
        status, refused, _ = await _raw(stack.url, [f"x-api-key: {LIMITED_KEY}"])
        ended = time.time()

    assert [a[0] for a in admitted] == [200, 200] and status == 429
    first = admitted[0][1]
    assert first["anthropic-ratelimit-requests-limit"] == "2"
    assert first["anthropic-ratelimit-requests-remaining"] == "1"
    assert first["anthropic-ratelimit-tokens-limit"] == "6000"
    estimate = 6000 - int(first["anthropic-ratelimit-tokens-remaining"])
    # Full again when the charge has refilled: one request of two a minute takes 30 s, the
    # tokens 1 s per 100; times in whole seconds, rounded up.
    assert began + 30 - 1 <= _reset_at(first["anthropic-ratelimit-requests-reset"]) <= ended + 30 + 1
    tokens_at = _reset_at(first["anthropic-ratelimit-tokens-reset"])
    assert began + estimate / 100 - 1 <= tokens_at <= ended + estimate / 100 + 1
    # Refused: both requests taken, the next whole one 30 s away; Anthropic's names only.
    assert refused["anthropic-ratelimit-requests-remaining"] == "0"
    # The refill while the test ran (2 requests a minute) shortens it by as much.
    assert 30 - math.ceil(ended - began) <= int(refused["retry-after"]) <= 30
    assert _reset_at(refused["anthropic-ratelimit-requests-reset"]) >= began + 60 - 1
    for headers in (first, refused):
        assert not [name for name in headers if name.startswith("x-ratelimit-")]


async def test_the_openai_routes_keep_their_envelope(stack: Stack) -> None:
    status, _, body = await _raw(stack.url, [], b"{}", path="/v1/chat/completions")
    assert status == 401 and orjson.loads(body)["error"]["code"] == "missing_api_key"


async def test_a_stream_cut_by_the_backend_ends_with_an_error_event(stack: Stack) -> None:
    stack.backends[0].behaviour = Behaviour(tokens=10, die_after_tokens=3)
    body = orjson.dumps({**orjson.loads(BODY), "max_tokens": 10, "stream": True})
    status, headers, raw = await _raw(stack.url, [KEY], body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert [name for name, _ in events][:2] == ["message_start", "content_block_start"]
    name, data = events[-1]
    assert name == "error"
    assert data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "backend closed the connection" in data["error"]["message"]


async def test_the_key_from_x_api_key_and_request_id(stack: Stack) -> None:
    status, headers, body = await _raw(stack.url, [KEY, "anthropic-version: 2023-06-01", "x-request-id: r-1"])
    assert status == 200, body
    assert headers["request-id"] == headers["x-request-id"] == "r-1"
    seen = stack.seen()[0].headers
    assert seen["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert MESSAGES_KEY not in str(seen)
    assert "x-api-key" not in seen and "anthropic-version" not in seen


async def test_both_headers_naming_one_key_pass(stack: Stack) -> None:
    lines = [KEY, f"authorization: Bearer {MESSAGES_KEY}"]
    assert (await _raw(stack.url, lines))[0] == 200


@pytest.mark.parametrize(
    ("lines", "status", "said"),
    [
        ([KEY, KEY], 400, "more than one x-api-key header"),
        ([KEY, f"X-Api-Key: {MESSAGES_KEY}"], 400, "more than one x-api-key header"),
        ([KEY, f"authorization: Bearer {KEYS['user']}"], 400, "name different keys"),
        ([f"x-api-key: {KEYS['user']}", f"authorization: Bearer {MESSAGES_KEY}"], 400, "name different keys"),
        (["x-api-key: "], 401, "empty x-api-key"),
        ([KEY, "authorization: Basic abc"], 401, "malformed Authorization"),
    ],
)
async def test_key_headers_that_could_name_two_keys_are_refused(
    stack: Stack, lines: list[str], status: int, said: str
) -> None:
    got, _, body = await _raw(stack.url, lines)
    assert got == status, body
    kind = "invalid_request_error" if status == 400 else "authentication_error"
    assert said in _error(status, body, kind)
    assert stack.forwarded() == 0


async def test_the_keys_tokens_are_settled_on_the_usage_vllm_reports() -> None:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = messages_profile(urls)
        data["keys"].append(
            {"name": "metered", "sha256": hash_key(LIMITED_KEY), "routes": ["messages"], "tpm": 6000}
        )
        return data

    async with router_stack(n_backends=1, shape=shape) as stack, stack.client() as client:
        stack.backends[0].behaviour = Behaviour(tokens=5)
        big = {**orjson.loads(BODY), "max_tokens": 500}
        headers = {"x-api-key": LIMITED_KEY}
        began = time.monotonic()
        first = await client.post("/v1/messages", json=big, headers=headers)
        second = await client.post("/v1/messages", json=big, headers=headers)
        slack = 6000 / 60 * (time.monotonic() - began) + 1
        used = first.json()["usage"]
        reported = used["input_tokens"] + used["output_tokens"]
        estimate = 6000 - int(first.headers["anthropic-ratelimit-tokens-remaining"])
        assert first.status_code == second.status_code == 200 and estimate > 500
        # The second sees the first's reported usage charged, not its estimate.
        remaining = int(second.headers["anthropic-ratelimit-tokens-remaining"])
        assert abs(remaining - (6000 - reported - estimate)) <= slack


async def test_max_tokens_is_written_down_to_the_lanes_bound_never_refused() -> None:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = messages_profile(urls)
        data["lanes"]["chat"]["max_output_tokens"] = 1200
        return data

    async with router_stack(n_backends=1, shape=shape) as stack, stack.client() as client:
        headers = {"x-api-key": MESSAGES_KEY}
        thinking = {"type": "enabled", "budget_tokens": 16_000}
        streamed = {**orjson.loads(BODY), "max_tokens": 32_000, "stream": True, "thinking": thinking}
        resp = await client.post("/v1/messages", json=streamed, headers=headers)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-lane-router-class"] == "chat"
        sent = orjson.loads(stack.seen()[0].body)
        assert sent["max_tokens"] == 1200 and sent["thinking"] == {"type": "enabled", "budget_tokens": 1199}
        # Not streamed, the same ceiling is a large generation, as a chat request stating no bound.
        whole = {**orjson.loads(BODY), "max_tokens": 32_000}
        resp = await client.post("/v1/messages", json=whole, headers=headers)
        assert resp.status_code == 200 and resp.headers["x-lane-router-class"] == "batch"
        small = await client.post("/v1/messages", content=BODY, headers=headers)
        assert small.headers["x-lane-router-class"] == "chat"
        assert orjson.loads(stack.seen()[-1].body)["max_tokens"] == 4


async def test_anthropic_requests_are_classified_as_chat_requests_are(stack: Stack) -> None:
    base = orjson.loads(BODY)
    tool = {"name": "f", "input_schema": {"type": "object"}}
    call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}
    turns = [
        *base["messages"],
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    cases = {
        "chat": base,
        "agent": {**base, "tools": [tool]},
        "long_context": {**base, "system": [{"type": "text", "text": "policy " * 200}]},
    }
    cases_with_blocks = {"agent": {**base, "messages": turns}}
    async with stack.client() as client:
        for expected, body in [*cases.items(), *cases_with_blocks.items()]:
            resp = await client.post("/v1/messages", json=body, headers={"x-api-key": MESSAGES_KEY})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-lane-router-class"] == expected, body
