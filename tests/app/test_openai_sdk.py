"""The official `openai` client against the router: streaming, errors, models."""

from __future__ import annotations

import time

import openai
import pytest

from tests.conftest import Stack, router_stack
from tests.proxy.test_handler_limits import LIMITED, with_limited_key
from tests.support.fakebackend import Behaviour
from tests.support.profiles import KEYS, MODEL


def _client(stack: Stack, key: str = "user") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=KEYS[key], max_retries=0, timeout=10)


async def test_streamed_chat_with_the_sdk(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=5, itl_s=0.01)
    async with _client(stack) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=5,
            extra_headers={"X-Request-Id": "sdk-1"},
        )
        pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    assert "".join(p or "" for p in pieces) == " t0 t1 t2 t3 t4"
    assert stack.seen()[0].headers["x-request-id"] == "user:sdk-1"


async def test_non_streamed_completion_and_models_with_the_sdk(stack: Stack) -> None:
    async with _client(stack) as client:
        done = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        models = await client.models.list()
    assert done.usage is not None and done.usage.completion_tokens == 16
    assert [m.id for m in models.data] == [MODEL]


async def test_sdk_sees_typed_errors(stack: Stack) -> None:
    async with openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as auth_err:
            await bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert auth_err.value.code == "invalid_api_key"
    async with _client(stack, "chat-only") as limited:
        with pytest.raises(openai.PermissionDeniedError):
            await limited.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            )
    async with _client(stack) as client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model=MODEL, messages="hi")  # type: ignore[arg-type]
    assert stack.forwarded() == 0


async def test_sdk_stream_cut_mid_way_surfaces_the_error_event(stack: Stack) -> None:
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=10, die_after_tokens=2)
    async with _client(stack) as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        with pytest.raises(openai.APIError) as err:
            async for _ in stream:
                pass
    assert "backend closed the connection" in err.value.message


async def test_the_sdk_retries_a_rate_limited_request_after_the_routers_retry_after() -> None:
    # 60 requests a minute: once the bucket is empty the next request is one second away at
    # most, and the router says so; the SDK's own backoff, without it, would wait half a second.
    async with (
        router_stack(n_backends=1, shape=with_limited_key(rpm=60)) as stack,
        openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=LIMITED, max_retries=1, timeout=10) as client,
    ):
        chat = client.chat.completions.with_raw_response
        for _ in range(300):  # the bucket refills one request a second while this empties it
            began = time.monotonic()
            raw = await chat.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            took = time.monotonic() - began
            if raw.retries_taken:
                break
    assert raw.retries_taken == 1 and raw.http_response.status_code == 200
    assert took >= 1.0
    assert raw.headers["x-ratelimit-limit-requests"] == "60"
