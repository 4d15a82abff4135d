"""Several models behind one router, on loopback in front of recording fake backends: a
request's model picks its model's lanes and its class the lane, so each model's requests reach
only the pools serving it; keys' model scopes and `/v1/models` follow; a reload that removes a
model refuses its requests at once and leaves the other models' streams alone."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Stack, router_stack
from tests.support.fakebackend import FakeBackend
from tests.support.profiles import CHAT_MODEL, EMBED_MODEL, RERANK_MODEL, auth, multi_model_profile

FAST, LARGE, EMBED, RERANK = range(4)
LONG_PROMPT = "word " * 400  # 2,000 bytes: past the test profile's long_context_tokens (1,000)


def _shape(urls: list[str]) -> dict[str, Any]:
    data = multi_model_profile(*urls)
    for key in data["keys"]:
        if key["name"] == "user":
            key["routes"] = ["chat", "completions", "embeddings", "rerank"]
    return data


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with router_stack(n_backends=4, shape=_shape) as s:
        # The `fast` pool's server serves the adapter the profile names: the router has seen it listed.
        s.backends[FAST].adapters["sql-lora"] = "/lora/sql-lora"
        fast = s.state.runtime.pools["fast"].backends[0]
        async with asyncio.timeout(10):
            while "sql-lora" not in (fast.served or ()):
                await asyncio.sleep(0.02)
        yield s


def _chat(model: str, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16, **extra}


def _only(stack: Stack, index: int, path: str) -> list[str]:
    """The paths every backend received, asserting only backend `index` received any."""
    got = {i: [s.path for s in b.seen] for i, b in enumerate(stack.backends) if b.seen}
    assert set(got) == {index}, got
    assert got[index] == [path]
    return got[index]


async def test_each_models_requests_reach_only_its_pools(stack: Stack) -> None:
    cases = [
        ("/v1/chat/completions", _chat(CHAT_MODEL), FAST, "chat"),
        ("/v1/chat/completions", _chat("llama-chat"), FAST, "chat"),
        ("/v1/chat/completions", _chat("sql-lora"), FAST, "chat"),
        ("/v1/chat/completions", _chat(CHAT_MODEL, LONG_PROMPT), LARGE, "long_context"),
        ("/v1/embeddings", {"model": EMBED_MODEL, "input": "a text"}, EMBED, "bge:chat"),
        ("/v1/embeddings", {"model": EMBED_MODEL, "input": LONG_PROMPT}, EMBED, "bge:long_context"),
        ("/v1/rerank", {"model": RERANK_MODEL, "query": "q", "documents": ["a", "b"]}, RERANK, "ranker:chat"),
    ]
    async with stack.client() as client:
        for path, body, index, lane in cases:
            for backend in stack.backends:
                backend.seen.clear()
            resp = await client.post(path, json=body, headers=auth("user"))

            assert resp.status_code == 200, (body["model"], resp.text)
            assert resp.headers["x-lane-router-lane"] == lane
            _only(stack, index, "/rerank" if path == "/v1/rerank" else path)


async def test_a_model_no_pool_serves_is_404_and_reaches_nobody(stack: Stack) -> None:
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=_chat("mistral"), headers=auth("user"))

    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    assert stack.forwarded() == 0


async def test_a_keys_model_scope_opens_only_its_models(stack: Stack) -> None:
    async with stack.client() as client:
        embed = await client.post(
            "/v1/embeddings", json={"model": EMBED_MODEL, "input": "x"}, headers=auth("bge-only")
        )
        chat = await client.post("/v1/chat/completions", json=_chat(CHAT_MODEL), headers=auth("bge-only"))
        alias = await client.post("/v1/chat/completions", json=_chat("llama-chat"), headers=auth("bge-only"))

    assert embed.status_code == 200
    assert (chat.status_code, chat.json()["error"]["code"]) == (403, "model_not_allowed")
    assert (alias.status_code, alias.json()["error"]["code"]) == (403, "model_not_allowed")
    _only(stack, EMBED, "/v1/embeddings")


async def test_models_lists_what_each_key_may_use(stack: Stack) -> None:
    async with stack.client() as client:
        every = await client.get("/v1/models", headers=auth("user"))
        scoped = await client.get("/v1/models", headers=auth("bge-only"))

    assert [m["id"] for m in every.json()["data"]] == sorted(
        [CHAT_MODEL, "llama-chat", "sql-lora", EMBED_MODEL, RERANK_MODEL]
    )
    assert [m["id"] for m in scoped.json()["data"]] == [EMBED_MODEL]
    parents = {m["id"]: (m["root"], m["parent"]) for m in every.json()["data"]}
    assert parents["sql-lora"] == (CHAT_MODEL, CHAT_MODEL) and parents["llama-chat"] == (CHAT_MODEL, None)


async def test_a_reload_removing_a_model_refuses_it_at_once_and_keeps_other_streams(tmp_path: Path) -> None:
    async with router_stack(n_backends=4, shape=_shape, config_dir=tmp_path) as stack:
        assert stack.config_path is not None
        fast: FakeBackend = stack.backends[FAST]
        hold = fast.behaviour.hold = asyncio.Event()
        fast.behaviour.tokens = 5
        async with stack.client() as client:
            streaming = asyncio.ensure_future(
                client.post("/v1/chat/completions", json=_chat(CHAT_MODEL, stream=True), headers=auth("user"))
            )
            await fast.wait_for(lambda: len(fast.seen) == 1)
            data = yaml.safe_load(stack.config_path.read_text())
            data["pools"].pop("embed")
            aside = stack.config_path.with_suffix(".tmp")
            aside.write_text(yaml.safe_dump(data))
            os.replace(aside, stack.config_path)
            reload = await client.post("/admin/reload", headers=auth("ops"))
            assert reload.status_code == 200 and reload.json()["result"] == "reloaded"

            gone = await client.post(
                "/v1/embeddings", json={"model": EMBED_MODEL, "input": "x"}, headers=auth("user")
            )
            assert (gone.status_code, gone.json()["error"]["code"]) == (404, "model_not_found")
            assert not streaming.done()
            hold.set()
            resp = await streaming

        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
        assert resp.text.count("chat.completion.chunk") >= 5
        assert stack.backends[EMBED].seen == []


async def test_the_admin_api_lists_every_lane_with_its_model_and_class(stack: Stack) -> None:
    async with stack.client() as client:
        lanes = (await client.get("/admin/lanes", headers=auth("ops"))).json()["lanes"]

    assert lanes["chat"] | {"model": CHAT_MODEL, "class": "chat", "pool": "fast"} == lanes["chat"]
    assert lanes["long_context"]["pool"] == "large"
    assert {
        name: (lane["model"], lane["class"], lane["pool"]) for name, lane in lanes.items() if ":" in name
    } == {
        f"{model}:{cls}": (model, cls, pool)
        for model, pool in ((EMBED_MODEL, "embed"), (RERANK_MODEL, "rerank"))
        for cls in ("chat", "rag", "long_context", "agent", "batch", "slow_stream")
    }


async def test_metrics_name_each_models_lane_and_keep_the_class(stack: Stack) -> None:
    async with stack.client() as client:
        for body in ({"model": EMBED_MODEL, "input": "x"}, {"model": EMBED_MODEL, "input": LONG_PROMPT}):
            assert (await client.post("/v1/embeddings", json=body, headers=auth("user"))).status_code == 200
        chat = await client.post("/v1/chat/completions", json=_chat(CHAT_MODEL), headers=auth("user"))
        assert chat.status_code == 200

    wanted = [
        'class="chat",lane="bge:chat",pool="embed",status="200"',
        'class="long_context",lane="bge:long_context",pool="embed",status="200"',
        'class="chat",lane="chat",pool="fast",status="200"',
    ]
    # A request is counted as its response ends: wait for the counts, with a deadline only a lost
    # count reaches.
    async with asyncio.timeout(30):
        while missing := [w for w in wanted if w not in stack.state.metrics.exposition().decode()]:
            await asyncio.sleep(0.02)
    assert missing == []
    exposition = stack.state.metrics.exposition().decode()
    assert 'lane_router_queue_time_seconds_count{lane="bge:chat"}' in exposition
    assert 'lane="llama' not in exposition and 'class="bge' not in exposition
