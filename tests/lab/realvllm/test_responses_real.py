"""The Responses API, tokenize and detokenize through the router on the real vLLM, spoken to
with the `openai` SDK. Both servers sit in one pool: a three-turn conversation stays on the
server that stores it, which each server's own answer to a direct retrieve shows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from router.keys.auth import hash_key
from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MODEL_NAME, SHARED_KEY
from tests.lab.realvllm.realrouter import RealRouter, real_router

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

API_KEY = "responses-key-0123456789"
OTHER_KEY = "other-responses-key-0123456789"
OUT = 4


def _one_pool(pools: RealPools) -> dict[str, Any]:
    """Both servers behind one pool (they share SHARED_KEY); every lane sends to it."""
    data = pools.profile()
    pool = data["pools"]["interactive"]
    pool["backends"] = [pools.interactive.url, pools.batch.url]
    pool["upstream_api_key"] = SHARED_KEY
    del data["pools"]["batch"]
    for lane in data["lanes"].values():
        lane["pool"] = "interactive"
        lane["balance"] = "round_robin"
    data["keys"] = [
        *data["keys"],
        {"name": "api", "sha256": hash_key(API_KEY), "routes": ["responses", "tokenize"]},
        {"name": "other", "sha256": hash_key(OTHER_KEY), "routes": ["responses"]},
    ]
    return data


@pytest.fixture
async def front(real_pools: RealPools) -> AsyncIterator[RealRouter]:
    async with real_router(_one_pool(real_pools)) as router:
        await router.settled()
        yield router


def _sdk(front: RealRouter, key: str = API_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key=key, max_retries=0, timeout=120)


async def _holders(pools: RealPools, response_id: str) -> list[str]:
    """The servers that answer a direct retrieve of `response_id` (vLLM 404s ids it lacks)."""
    found = []
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {SHARED_KEY}"}) as http:
        for name, server in pools.servers.items():
            if (await http.get(f"{server.url}/v1/responses/{response_id}")).status_code == 200:
                found.append(name)
    return found


async def test_a_three_turn_conversation_stays_on_the_server_that_stores_it(
    real_pools: RealPools, front: RealRouter
) -> None:
    common: dict[str, Any] = {"model": MODEL_NAME, "max_output_tokens": OUT, "temperature": 0.0}
    async with _sdk(front) as api:
        first = await api.responses.create(input="Name a colour.", **common)
        second = await api.responses.create(input="Another one?", previous_response_id=first.id, **common)
        third = await api.responses.create(input="And one more?", previous_response_id=second.id, **common)
        # A fresh conversation goes to the other server (round robin): the pool really has two.
        fresh = await api.responses.create(input="Name a fruit.", **common)
    holders = {tuple(await _holders(real_pools, r.id)) for r in (first, second, third)}
    assert len(holders) == 1 and len(next(iter(holders))) == 1, holders
    assert (await _holders(real_pools, fresh.id)) != list(next(iter(holders)))
    assert third.previous_response_id == second.id
    async with _sdk(front, OTHER_KEY) as other:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(third.id)
    async with _sdk(front) as api:
        again = await api.responses.retrieve(third.id)
    assert again.id == third.id and again.output_text == third.output_text


async def test_a_streamed_response_is_remembered_from_its_created_event(
    real_pools: RealPools, front: RealRouter
) -> None:
    async with _sdk(front) as api:
        stream = await api.responses.create(
            model=MODEL_NAME, input="Count to three.", max_output_tokens=OUT, temperature=0.0, stream=True
        )
        kinds = []
        created = None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.created":
                created = event.response.id
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert created is not None
        follow = await api.responses.create(
            model=MODEL_NAME, input="Go on.", max_output_tokens=OUT, previous_response_id=created
        )
    assert await _holders(real_pools, created) == await _holders(real_pools, follow.id)


async def test_tokenize_and_detokenize_need_the_scope_and_round_trip(front: RealRouter) -> None:
    async with httpx.AsyncClient(base_url=front.url, timeout=60) as http:
        mine = {"authorization": f"Bearer {API_KEY}"}
        tokens = await http.post(
            "/tokenize", json={"model": MODEL_NAME, "prompt": "hello world"}, headers=mine
        )
        assert tokens.status_code == 200, tokens.text
        ids = tokens.json()["tokens"]
        text = await http.post("/detokenize", json={"model": MODEL_NAME, "tokens": ids}, headers=mine)
        assert text.status_code == 200 and text.json()["prompt"].strip() == "hello world"
        refused = await http.post(
            "/tokenize",
            json={"model": MODEL_NAME, "prompt": "x"},
            headers={"authorization": f"Bearer {OTHER_KEY}"},
        )
        assert refused.status_code == 403
