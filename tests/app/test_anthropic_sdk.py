"""The official `anthropic` client against the router, in front of backends that answer as vLLM's
Anthropic Messages API does: streamed and whole messages, count_tokens, its typed errors, and a
client that leaves mid-stream."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import orjson
import pytest
from anthropic.types import MessageParam

from router.keys.auth import hash_key
from tests.conftest import Stack, router_stack
from tests.support.anthropicapi import messages_profile, sdk
from tests.support.fakebackend import Behaviour
from tests.support.profiles import KEYS, MODEL, UPSTREAM_KEY

HI: list[MessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with router_stack(n_backends=1, shape=messages_profile) as s:
        yield s


async def test_a_whole_message_with_the_sdk(stack: Stack) -> None:
    stack.backends[0].behaviour = Behaviour(tokens=4)
    async with sdk(stack.url) as client:
        raw = await client.messages.with_raw_response.create(model=MODEL, max_tokens=100, messages=HI)
        done = await raw.parse()
    assert [block.type for block in done.content] == ["text"]
    assert done.content[0].text == " t0 t1 t2 t3"  # type: ignore[union-attr]
    assert done.usage.output_tokens == 4
    assert raw.headers["request-id"] == raw.headers["x-request-id"]
    seen = stack.seen()[0]
    assert seen.path == "/v1/messages"
    # The router's own key upstream; the client's, and Anthropic's version header, stay behind.
    assert seen.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert "x-api-key" not in seen.headers and "anthropic-version" not in seen.headers
    assert orjson.loads(seen.body)["max_tokens"] == 100


async def test_a_streamed_message_with_the_sdk(stack: Stack) -> None:
    stack.backends[0].behaviour = Behaviour(tokens=5, itl_s=0.01)
    async with (
        sdk(stack.url) as client,
        client.messages.stream(
            model=MODEL, max_tokens=3, messages=HI, system=[{"type": "text", "text": "be brief"}]
        ) as stream,
    ):
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces) == " t0 t1 t2"
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


async def test_count_tokens_with_the_sdk(stack: Stack) -> None:
    async with sdk(stack.url) as client:
        counted = await client.messages.count_tokens(model=MODEL, messages=HI)
    assert counted.input_tokens > 0
    seen = stack.seen()[0]
    assert seen.path == "/v1/messages/count_tokens"
    assert "max_tokens" not in orjson.loads(seen.body)


async def test_the_sdk_reads_the_routers_errors_as_its_own(stack: Stack) -> None:
    async with sdk(stack.url, key="wrong-key") as bad:
        with pytest.raises(anthropic.AuthenticationError) as unauthorized:
            await bad.messages.create(model=MODEL, max_tokens=5, messages=HI)
    assert unauthorized.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }
    async with sdk(stack.url, key=KEYS["user"]) as unscoped:  # a key without the messages scope
        with pytest.raises(anthropic.PermissionDeniedError):
            await unscoped.messages.create(model=MODEL, max_tokens=5, messages=HI)
    async with sdk(stack.url) as client:
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=5, messages=HI)
        with pytest.raises(anthropic.BadRequestError) as bad_request:
            await client.messages.create(model=MODEL, max_tokens=0, messages=HI)
    assert "max_tokens" in bad_request.value.message
    assert stack.forwarded() == 0


async def test_a_stream_cut_mid_way_ends_with_an_error_event_the_sdk_raises(stack: Stack) -> None:
    stack.backends[0].behaviour = Behaviour(tokens=10, die_after_tokens=2)
    async with sdk(stack.url) as client:
        stream = await client.messages.create(model=MODEL, max_tokens=10, messages=HI, stream=True)
        with pytest.raises(anthropic.APIStatusError) as err:
            async for _ in stream:
                pass
    assert err.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": err.value.body["error"]["message"]},  # type: ignore[index]
    }
    assert "backend closed the connection" in str(err.value.message)


async def test_a_client_leaving_mid_stream_closes_the_upstream_request(stack: Stack) -> None:
    backend = stack.backends[0]
    backend.behaviour = Behaviour(tokens=10_000, itl_s=0.01)
    async with sdk(stack.url) as client:
        stream = await client.messages.create(model=MODEL, max_tokens=10_000, messages=HI, stream=True)
        events = 0
        async for _ in stream:
            events += 1
            if events == 4:
                break
        await stream.close()
    await backend.wait_for(lambda: backend.seen[0].disconnected is not None, timeout=10)
    assert backend.seen[0].finished is None


async def test_the_key_from_x_api_key_on_the_anthropic_routes_only(stack: Stack) -> None:
    async with sdk(stack.url, x_api_key=True) as client:
        done = await client.messages.create(model=MODEL, max_tokens=2, messages=HI)
        # On an OpenAI route `x-api-key` is no key at all.
        with pytest.raises(anthropic.AuthenticationError):
            await client.post("/v1/chat/completions", cast_to=object, body={"model": MODEL, "messages": HI})
    assert done.content[0].text == " t0 t1"  # type: ignore[union-attr]
    assert stack.forwarded() == 1
    assert "x-api-key" not in stack.seen()[0].headers


LIMITED = "limited-messages-key-0123456789"


def _limited(**limits: Any) -> Any:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = messages_profile(urls)
        data["keys"].append(
            {"name": "limited", "sha256": hash_key(LIMITED), "routes": ["messages"], **limits}
        )
        return data

    return shape


async def test_the_sdk_retries_a_rate_limited_message_after_the_routers_retry_after() -> None:
    # 60 requests a minute: once the bucket is empty the next request is one second away at
    # most, and the router says so; the SDK's own backoff, without it, would wait half a second.
    async with (
        router_stack(n_backends=1, shape=_limited(rpm=60)) as stack,
        anthropic.AsyncAnthropic(base_url=stack.url, api_key=LIMITED, max_retries=1, timeout=10) as client,
    ):
        create = client.messages.with_raw_response.create
        for _ in range(300):  # the bucket refills one request a second while this empties it
            began = time.monotonic()
            raw = await create(model=MODEL, max_tokens=2, messages=HI)
            took = time.monotonic() - began
            if raw.retries_taken:
                break
    assert raw.retries_taken == 1 and raw.http_response.status_code == 200
    assert took >= 1.0
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "60"


async def test_the_sdk_does_not_retry_a_message_larger_than_the_keys_tokens_per_minute() -> None:
    async with (
        router_stack(n_backends=1, shape=_limited(tpm=500)) as stack,
        anthropic.AsyncAnthropic(base_url=stack.url, api_key=LIMITED, max_retries=3, timeout=10) as client,
    ):
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.create(model=MODEL, max_tokens=1000, messages=HI)
        text = stack.state.metrics.exposition().decode()
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert 'lane_router_rejected_total{reason="request_too_large"} 1.0' in text  # asked once
