"""The router in front of two real vLLM pools, spoken to with the `openai` SDK.

Where a request went is read from each server's own counters, and what vLLM received from its
answers (vLLM names a request after the X-Request-Id it was sent), never from the router's word.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionStreamOptionsParam

from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MODEL_NAME, POOL_KEYS, SHARED_KEY
from tests.lab.realvllm.realrouter import AccessLog, RealRouter, finished, finished_since
from tests.support.profiles import KEYS, auth

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

OUT = 8
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name three colours of the rainbow, please."},
]
PROMPT = "The quick brown fox"
GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


def direct(pools: RealPools, pool: str = "interactive") -> openai.AsyncOpenAI:
    server = pools.servers[pool]
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=POOL_KEYS[pool], max_retries=0, timeout=60)


@dataclass
class Answer:
    """What a client saw of one request: response headers, the response ids, text and usage."""

    headers: Mapping[str, str]
    ids: set[str]
    text: str
    usage: CompletionUsage | None


async def ask_chat(api: openai.AsyncOpenAI, rid: str, stream: bool) -> Answer:
    create = api.chat.completions.with_streaming_response.create
    common: dict[str, Any] = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": OUT, **GREEDY}
    headers = {"X-Request-Id": rid}
    if not stream:
        async with create(**common, extra_headers=headers) as resp:
            reply = await resp.parse()
            return Answer(resp.headers, {reply.id}, reply.choices[0].message.content or "", reply.usage)
    options: ChatCompletionStreamOptionsParam = {"include_usage": True}
    async with create(**common, stream=True, stream_options=options, extra_headers=headers) as resp:
        answer = Answer(resp.headers, set(), "", None)
        async for chunk in await resp.parse():
            answer.ids.add(chunk.id)
            answer.text += "".join(c.delta.content or "" for c in chunk.choices)
            answer.usage = chunk.usage or answer.usage
        return answer


async def ask_completion(api: openai.AsyncOpenAI, rid: str, stream: bool) -> Answer:
    create = api.completions.with_streaming_response.create
    common: dict[str, Any] = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": OUT, **GREEDY}
    headers = {"X-Request-Id": rid}
    if not stream:
        async with create(**common, extra_headers=headers) as resp:
            reply = await resp.parse()
            return Answer(resp.headers, {reply.id}, reply.choices[0].text, reply.usage)
    options: ChatCompletionStreamOptionsParam = {"include_usage": True}
    async with create(**common, stream=True, stream_options=options, extra_headers=headers) as resp:
        answer = Answer(resp.headers, set(), "", None)
        async for chunk in await resp.parse():
            answer.ids.add(chunk.id)
            answer.text += "".join(c.text for c in chunk.choices)
            answer.usage = chunk.usage or answer.usage
        return answer


ENDPOINTS = [
    pytest.param(ask_chat, "chatcmpl-", id="chat"),
    pytest.param(ask_completion, "cmpl-", id="completions"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("ask", "id_prefix"), ENDPOINTS)
async def test_openai_client_through_the_router(
    real_pools: RealPools,
    lane_router: RealRouter,
    ask: Callable[[openai.AsyncOpenAI, str, bool], Awaitable[Answer]],
    id_prefix: str,
    stream: bool,
) -> None:
    # Greedy decoding: the server's own non-streamed answer is what the router must deliver.
    expected = await ask(direct(real_pools), "direct-" + uuid.uuid4().hex, False)
    before = await finished(real_pools.servers)
    rid = "lr-" + uuid.uuid4().hex
    got = await ask(lane_router.openai(), rid, stream)
    assert got.headers["x-request-id"] == rid
    assert got.headers["x-lane-router-lane"] == "chat"
    # vLLM names the request after the X-Request-Id it received: the id went through the router,
    # under the key's name.
    assert got.ids == {id_prefix + "user:" + rid}
    assert got.text == expected.text
    assert got.usage is not None and expected.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (expected.usage.prompt_tokens, OUT)
    assert await finished_since(real_pools.servers, before, 1) == {"interactive": 1, "batch": 0}


# (client key, streamed, max_tokens) → the pool whose server must have run the request.
LANDINGS = [
    pytest.param("user", True, OUT, "interactive", id="chat-streamed"),
    pytest.param("user", False, OUT, "interactive", id="chat-whole"),
    pytest.param("nightly", True, OUT, "batch", id="key-pinned-batch"),
    pytest.param("user", False, 300, "batch", id="large-whole-generation"),
    pytest.param("user", True, 300, "interactive", id="large-streamed-generation"),
]


@pytest.mark.parametrize(("key", "stream", "max_tokens", "pool"), LANDINGS)
async def test_request_lands_in_its_class_pool(
    real_pools: RealPools, lane_router: RealRouter, key: str, stream: bool, max_tokens: int, pool: str
) -> None:
    before = await finished(real_pools.servers)
    api = lane_router.openai(key).chat.completions.with_streaming_response
    async with api.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=max_tokens, stream=stream, **GREEDY
    ) as resp:
        assert resp.status_code == 200
        await resp.read()
    other = "batch" if pool == "interactive" else "interactive"
    assert await finished_since(real_pools.servers, before, 1) == {pool: 1, other: 0}


async def test_client_keys_are_not_pool_keys(real_pools: RealPools, lane_router: RealRouter) -> None:
    # The servers refuse the client's key: a request that works through the router was sent
    # upstream with its pool's own key (each server accepts only its pool's and the shared key).
    for pool in ("interactive", "batch"):
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(
                base_url=f"{real_pools.servers[pool].url}/v1", api_key=KEYS["user"], max_retries=0
            ).models.list()
    assert KEYS["user"] not in {*POOL_KEYS.values(), SHARED_KEY}
    before = await finished(real_pools.servers)
    reply = await lane_router.openai("nightly").completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=OUT, **GREEDY
    )
    assert reply.usage is not None and reply.usage.completion_tokens == OUT
    assert await finished_since(real_pools.servers, before, 1) == {"interactive": 0, "batch": 1}


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer not-a-key", f"Bearer {POOL_KEYS['interactive']}", f"Bearer {SHARED_KEY}", KEYS["user"]],
    ids=["none", "unknown", "pool-key", "shared-pool-key", "no-bearer-scheme"],
)
async def test_bad_key_is_refused_by_the_router_and_never_forwarded(
    real_pools: RealPools, lane_router: RealRouter, authorization: str | None
) -> None:
    logs = {name: AccessLog(server) for name, server in real_pools.servers.items()}
    marks = {name: await log.mark() for name, log in logs.items()}
    before = await finished(real_pools.servers)
    headers = {} if authorization is None else {"authorization": authorization}
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": OUT}
    async with lane_router.http() as client:
        for path in ("/v1/chat/completions", "/v1/completions"):
            resp = await client.post(path, json=body, headers=headers)
            assert resp.status_code == 401
            assert resp.json()["error"]["type"] == "authentication_error"  # the router's envelope
        assert (await client.get("/v1/models", headers=auth("user"))).status_code == 200
    for name, log in logs.items():
        # The router's health rounds read each server's GET /v1/models whatever the test does;
        # what a client sends would be a POST.
        seen = await log.since(marks[name])
        reached = [line for line in seen if line[1].startswith("/v1/") and line[0] != "GET"]
        assert reached == [], f"{name} server saw {reached}"
    assert await finished(real_pools.servers) == before
