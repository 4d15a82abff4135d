"""The shipped profiles live: each on the simulator's engines, every class served by its lane."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest
import yaml

from router.config.load import load_profile
from router.config.models import ALL_CLASSES
from router.keys.auth import hash_key, new_key
from router.lab.sim.cli import DEFAULT_PRESET
from router.lab.sim.timing import StepTimeModel, load_preset
from tests.config.test_profiles import BACKENDS, ENV_KEYS, MULTI, NAMES, path
from tests.lab.simstack import sim_stack


@pytest.mark.parametrize("name", NAMES)
def test_same_eight_backends_same_model_as_the_simulator(name: str) -> None:
    cfg = load_profile(path(name))
    origins = sorted(o for pool in cfg.pools.values() for o in pool.origins)
    assert origins == BACKENDS
    assert {pool.model for pool in cfg.pools.values()} == {load_preset(DEFAULT_PRESET).model}
    assert set(cfg.lanes) == set(ALL_CLASSES)


# --- each profile, live, against simulated pools -----------------------------------------------

FAST = StepTimeModel(c0=0.001, c_prefill=1e-6, c_decode=1e-5, c_ctx=0.0)
DOC = "The quarterly report describes revenue, costs and the outlook in detail. " * 40  # ≈730 tokens


def requests(model: str, long_tokens: int) -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
    """One request per class, each reaching its class by its own signal (slow_stream by header:
    a slow client has to be measured first); the long-context prompt is just above the profile's
    `long_tokens` threshold."""

    def chat(text: str, **extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}

    tool = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    return {
        "chat": ({}, chat("Hello!", stream=True)),
        "agent": ({"x-session-id": "s-1"}, chat("Find the file.", tools=[tool])),
        "long_context": ({}, chat("word " * (long_tokens + 500), max_tokens=4)),
        "batch": ({}, chat("Summarize the notes.", max_tokens=256)),
        "rag": ({}, chat(DOC + " What were the costs?", stream=True)),
        "slow_stream": ({"x-request-class": "slow_stream"}, chat("Tell me a story.", stream=True)),
    }


@pytest.mark.parametrize("name", NAMES)
async def test_every_class_is_served_by_its_lane(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = {var: new_key() for var in ENV_KEYS}
    for var, key in keys.items():
        monkeypatch.setenv(var, hash_key(key))
    data = yaml.safe_load(path(name).read_text())
    data["debug_headers"] = True
    auth = {"authorization": f"Bearer {keys['LANE_ROUTER_KEY_TESTER_SHA256']}"}
    async with sim_stack(data, timing=FAST) as stack, stack.client() as client:
        model = data["pools"][next(iter(data["pools"]))]["model"]
        lanes = stack.state.runtime.lanes
        long_tokens = stack.state.runtime.config.classify.long_context_tokens
        for cls, (headers, body) in requests(model, long_tokens).items():
            if cls == "rag":  # the third sending of a document is RAG
                for _ in range(2):
                    await _ok(client, {**auth, **headers}, body)
            resp = await _ok(client, {**auth, **headers}, body)
            assert resp.headers["x-lane-router-class"] == cls, (cls, resp.headers["x-lane-router-reason"])
            assert resp.headers["x-lane-router-lane"] == cls
        wanted = [
            f'class="{lane.cls.value}",lane="{name}",pool="{lane.pool.name}",status="200"'
            for name, lane in lanes.items()
        ]
        # A decoupled stream's client can have its last byte before the router counts the request:
        # wait for the counts, with a deadline that only a lost count (not a busy machine) reaches.
        missing = wanted
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(60):
                while missing := [w for w in wanted if w not in stack.state.metrics.exposition().decode()]:
                    await asyncio.sleep(0.02)
        counted = [
            ln for ln in stack.state.metrics.exposition().decode().splitlines() if "requests_total{" in ln
        ]
        assert missing == [], counted


async def _ok(client: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any]) -> httpx.Response:
    resp = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    if body.get("stream"):
        assert resp.text.rstrip().endswith("data: [DONE]")
    else:
        assert resp.json()["choices"][0]["message"]["content"]
    return resp


CHAT_MODEL, EMBED_MODEL, RERANK_MODEL = (
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "BAAI/bge-base-en-v1.5",
    "BAAI/bge-reranker-v2-m3",
)


async def test_the_multi_model_profile_sends_each_name_to_its_models_lanes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = {var: new_key() for var in ENV_KEYS}
    for var, key in keys.items():
        monkeypatch.setenv(var, hash_key(key))
    data = yaml.safe_load(path(MULTI).read_text())
    data["debug_headers"] = True
    tester = {"authorization": f"Bearer {keys['LANE_ROUTER_KEY_TESTER_SHA256']}"}
    web = {"authorization": f"Bearer {keys['LANE_ROUTER_KEY_WEB_SHA256']}"}

    def chat(model: str, text: str = "Hello!", **extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}

    long_text = "word " * 10_500
    cases = [
        (chat(CHAT_MODEL, stream=True), "chat", "interactive"),
        (chat("llama", stream=True), "chat", "interactive"),
        (chat("llama", long_text), "long_context", "large"),
        (chat(CHAT_MODEL, max_tokens=256), "batch", "large"),
        (chat(EMBED_MODEL, stream=True), f"{EMBED_MODEL}:chat", "embed"),
        (chat(RERANK_MODEL, stream=True), f"{RERANK_MODEL}:chat", "rerank"),
        (chat(RERANK_MODEL, max_tokens=256), f"{RERANK_MODEL}:batch", "rerank"),
    ]
    async with sim_stack(data, timing=FAST) as stack, stack.client() as client:
        lanes = stack.state.runtime.lanes
        for body, lane, pool in cases:
            resp = await _ok(client, tester, body)
            assert resp.headers["x-lane-router-lane"] == lane, body["model"]
            assert lanes[lane].pool.name == pool and lanes[lane].model in (
                CHAT_MODEL,
                EMBED_MODEL,
                RERANK_MODEL,
            )
        listed = await client.get("/v1/models", headers=web)
        refused = await client.post("/v1/chat/completions", json=chat(EMBED_MODEL), headers=web)

    assert [m["id"] for m in listed.json()["data"]] == sorted([CHAT_MODEL, "llama", "sql-lora"])
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "model_not_allowed")
