"""One router in front of two real servers holding different models: every model's and the
adapter's requests reach only the server that holds them (the servers' own counters and the
answers' `model` say so), and `/v1/models` lists to each key exactly what it may use."""

from __future__ import annotations

import asyncio

import pytest

from tests.lab.realvllm.multimodel.front import chat, http, served
from tests.lab.realvllm.multimodel.profile import ADAPTER, LAZY_ADAPTER, MODEL_A, MODEL_B, TwoModels
from tests.lab.realvllm.realrouter import AccessLog, RealRouter, finished, finished_since

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

ROUNDS = 3


async def test_each_model_and_the_adapter_reach_only_their_server(
    two_models: TwoModels, mm_router: RealRouter
) -> None:
    servers = {"a": two_models.a, "b": two_models.b}
    before = await finished(servers)
    lanes: dict[str, set[str]] = {}
    async with http(mm_router) as client:
        for model in (MODEL_A, ADAPTER, MODEL_B) * ROUNDS:
            resp = await client.post("/v1/chat/completions", json=chat(model))
            assert resp.status_code == 200, resp.text
            # vLLM names in `model` what answered: the base model, the adapter, or the other model.
            assert resp.json()["model"] == model
            lanes.setdefault(model, set()).add(resp.headers["x-lane-router-lane"])
    # B does not hold the adapter (it answers 404 for it): A answered every adapter request.
    assert await finished_since(servers, before, expected=3 * ROUNDS) == {"a": 2 * ROUNDS, "b": ROUNDS}
    # The adapter takes its parent model's lanes; the second model's chat lane is its own.
    assert lanes == {MODEL_A: {"chat"}, ADAPTER: {"chat"}, MODEL_B: {f"{MODEL_B}:chat"}}


async def test_a_model_nobody_serves_is_404(mm_router: RealRouter) -> None:
    async with http(mm_router) as client:
        resp = await client.post("/v1/chat/completions", json=chat("tiny-c"))
    assert resp.status_code == 404, resp.text
    assert resp.json()["error"]["code"] == "model_not_found"


async def listed(router: RealRouter, key: str) -> set[str]:
    async with http(router, key) as client:
        resp = await client.get("/v1/models")
    assert resp.status_code == 200, resp.text
    return {m["id"] for m in resp.json()["data"]}


async def test_models_lists_to_each_key_what_it_may_use(two_models: TwoModels, mm_router: RealRouter) -> None:
    assert {MODEL_A, ADAPTER, MODEL_B} <= await listed(mm_router, "all")
    # A key's `models:` names adapters like models: `tiny` alone does not open its adapters.
    assert await listed(mm_router, "tiny-only") == {MODEL_A}
    assert await listed(mm_router, "b-only") == {MODEL_B}
    before = await finished({"a": two_models.a, "b": two_models.b})
    refused = [("b-only", MODEL_A), ("b-only", ADAPTER), ("tiny-only", ADAPTER), ("tiny-only", MODEL_B)]
    for key, model in refused:
        async with http(mm_router, key) as client:
            resp = await client.post("/v1/chat/completions", json=chat(model))
        assert resp.status_code == 403, (key, model, resp.text)
        assert resp.json()["error"]["code"] == "model_not_allowed"
    async with http(mm_router, "b-only") as client:
        assert (await client.post("/v1/chat/completions", json=chat(MODEL_B))).status_code == 200
    # Only the allowed request reached a server.
    after = await finished_since({"a": two_models.a, "b": two_models.b}, before, expected=1)
    assert after == {"a": 0, "b": 1}


async def test_a_profile_adapter_is_loaded_on_demand_then_answered(
    two_models: TwoModels, mm_router: RealRouter
) -> None:
    assert LAZY_ADAPTER not in await served(two_models.a)
    log = AccessLog(two_models.a)
    mark = await log.mark()
    async with http(mm_router) as client:
        # Several at once: the router loads the adapter once, the others wait for that load.
        answers = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=chat(LAZY_ADAPTER)) for _ in range(3))
        )
    for resp in answers:
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == LAZY_ADAPTER
    loads = [line for line in await log.since(mark) if line[1] == "/v1/load_lora_adapter"]
    assert loads == [("POST", "/v1/load_lora_adapter", 200)]
    on_a, on_b = await served(two_models.a), await served(two_models.b)
    assert on_a[LAZY_ADAPTER]["parent"] == MODEL_A
    assert LAZY_ADAPTER not in on_b
