"""The simulator's HTTP surface, through real uvicorn servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from router.lab.sim.config import EngineConfig
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import StepTimeModel
from router.request.tokens import estimate_messages_tokens, estimate_text_tokens

FAST = StepTimeModel(c0=0.002, c_prefill=1e-6, c_decode=1e-5, c_ctx=0.0)
# Slow enough that a handler on a busy machine never lags a step (no chunk coalescing).
PACED = StepTimeModel(c0=0.02, c_prefill=0.0, c_decode=0.0, c_ctx=0.0)
MODEL = "sim-model"


def spec(**overrides: Any) -> EngineSpec:
    settings = ServerSettings(served_model_names=(MODEL,), api_key=overrides.pop("api_key", None))
    timing = overrides.pop("timing", FAST)
    base: dict[str, Any] = dict(
        max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=64, num_gpu_blocks=2048
    )
    base.update(overrides)
    return EngineSpec(port=0, config=EngineConfig(**base), timing=timing, settings=settings)


@contextlib.asynccontextmanager
async def sim(**overrides: Any) -> AsyncIterator[str]:
    async with SimCluster([spec(**overrides)]) as cluster:
        yield cluster.urls[0]


async def metric(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


async def poll(check: Callable[[], Any], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.01)


def sse_events(raw: str) -> list[str]:
    return [line[len("data: ") :] for line in raw.split("\n\n") if line.startswith("data: ")]


MESSAGES: Any = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about paged attention in two lines, please."},
]


async def test_probes_and_model_list() -> None:
    async with sim(version="0.32.0") as url, httpx.AsyncClient(base_url=url) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ping")).status_code == 200
        assert (await c.get("/version")).json() == {"version": "0.32.0"}
        models = (await c.get("/v1/models")).json()
        assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 2048
        assert (await c.get("/load")).json() == {"server_load": 0}
        assert (await c.get("/nope")).status_code == 404
        assert (await c.get("/v1/chat/completions")).status_code == 405


async def test_chat_with_the_openai_sdk_non_streamed() -> None:
    async with sim() as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
        out = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, extra_body={"ignore_eos": True}
        )
        await client.close()
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == estimate_messages_tokens(MESSAGES)
    text = out.choices[0].message.content or ""
    assert estimate_text_tokens(text) == 12 and len(text) == 48


async def test_chat_with_the_openai_sdk_streamed_with_usage() -> None:
    async with sim() as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
        await client.close()
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert estimate_text_tokens(content) == 9
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9


async def test_completions_stream_wire_format() -> None:
    async with sim(timing=PACED) as url, httpx.AsyncClient(base_url=url) as c:
        r = await c.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x" * 400, "max_tokens": 5, "stream": True, "ignore_eos": True},
        )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    bodies = [orjson.loads(e) for e in events[:-1]]
    assert all(b["object"] == "text_completion" for b in bodies)
    assert [b["choices"][0]["finish_reason"] for b in bodies] == [None] * 4 + ["length"]
    assert all(b["id"] == bodies[0]["id"] and b["id"].startswith("cmpl-") for b in bodies)


async def test_stream_interval_batches_tokens_per_chunk() -> None:
    async with sim(stream_interval=4, timing=PACED) as url, httpx.AsyncClient(base_url=url) as c:
        r = await c.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "hello there",
                "max_tokens": 13,
                "stream": True,
                "ignore_eos": True,
            },
        )
    texts = [orjson.loads(e)["choices"][0]["text"] for e in sse_events(r.text)[:-1]]
    # The first token alone, then groups of four, the last group possibly short.
    assert [estimate_text_tokens(t) for t in texts] == [1, 4, 4, 4]


async def test_errors_look_like_vllm() -> None:
    async with sim() as url, httpx.AsyncClient(base_url=url) as c:
        too_long = await c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 5000}
        )
        assert too_long.status_code == 400
        err = too_long.json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400
        assert "maximum context length is 2048" in err["message"]
        unknown = await c.post("/v1/chat/completions", json={"model": "gpt-x", "messages": MESSAGES})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"] == "The model `gpt-x` does not exist."
        bad = await c.post("/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert bad.status_code == 400
        huge_prompt = await c.post("/v1/completions", json={"model": MODEL, "prompt": "y" * 9000})
        assert huge_prompt.status_code == 400


async def test_queue_limit_is_a_503_before_the_stream_starts() -> None:
    slow = StepTimeModel(c0=0.05, c_prefill=0.0, c_decode=0.0, c_ctx=0.0)
    async with (
        sim(max_num_seqs=1, max_num_batched_tokens=64, max_num_queued_reqs=1, timing=slow) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as c,
    ):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 40, "ignore_eos": True, "stream": True}
        first = asyncio.ensure_future(c.post("/v1/completions", json=body))
        await poll(lambda: _gauge_at_least(c, "vllm:num_requests_running", 1))
        second = asyncio.ensure_future(c.post("/v1/completions", json=body))
        await poll(lambda: _gauge_at_least(c, "vllm:num_requests_waiting", 1))
        third = await c.post("/v1/completions", json=body)
        assert third.status_code == 503
        assert third.json()["error"]["code"] == 503
        assert (await first).status_code == 200 and (await second).status_code == 200


async def _gauge_at_least(c: httpx.AsyncClient, name: str, n: float) -> bool:
    return await metric(c, name) >= n


async def test_api_key_covers_only_v1_like_vllm() -> None:
    async with sim(api_key="sekret") as url, httpx.AsyncClient(base_url=url) as c:
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer wrong"})).status_code == 401
        ok = await c.get("/v1/models", headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
        # The hole: full inference without any key.
        inv = await c.post("/invocations", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 3})
        assert inv.status_code == 200 and inv.json()["object"] == "chat.completion"
        inv2 = await c.post("/invocations", json={"prompt": "abc", "max_tokens": 2})
        assert inv2.json()["object"] == "text_completion"
        for path in ("/metrics", "/version", "/load", "/ping", "/openapi.json", "/health"):
            assert (await c.get(path)).status_code == 200, path
        tok = await c.post("/tokenize", json={"prompt": "abcdefgh"})
        assert tok.status_code == 200 and tok.json()["count"] == 2
        detok = await c.post("/detokenize", json={"tokens": tok.json()["tokens"]})
        assert detok.status_code == 200


async def test_tokenize_counts_every_role_of_a_chat() -> None:
    # Role markers change a chat's first ids; every id stays a 64-bit JSON integer.
    roles = ("user", "system", "assistant", "tool", "developer", "x" * 40)
    messages = [{"role": role, "content": "tell me more"} for role in roles]
    async with sim() as url, httpx.AsyncClient(base_url=url) as c:
        tok = await c.post("/tokenize", json={"messages": messages})
        assert tok.status_code == 200, tok.text
        ids = tok.json()["tokens"]
        assert tok.json()["count"] == len(ids) == estimate_messages_tokens(messages)
        assert all(0 <= i < 1 << 63 for i in ids)
        odd = await c.post("/tokenize", json={"messages": ["not a message"]})
        assert odd.status_code == 400


async def test_client_disconnect_aborts_and_frees_blocks() -> None:
    slow = StepTimeModel(c0=0.01, c_prefill=0.0, c_decode=0.0, c_ctx=0.0)
    async with sim(timing=slow) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:
        body = {"model": MODEL, "prompt": "z" * 2000, "max_tokens": 1000, "ignore_eos": True, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            chunks = r.aiter_bytes()  # held: a dropped iterator would close the stream early
            await anext(chunks)
            assert await metric(c, "vllm:num_requests_running") == 1
            assert await metric(c, "vllm:kv_cache_usage_perc") > 0
        await poll(lambda: _gauge_is(c, "vllm:num_requests_running", 0))
        assert await metric(c, "vllm:kv_cache_usage_perc") == 0
        text = (await c.get("/metrics")).text
        assert 'finished_reason="abort"} 1.0' in text


async def _gauge_is(c: httpx.AsyncClient, name: str, value: float) -> bool:
    return await metric(c, name) == value


async def test_repeated_prefix_hits_the_prefix_cache() -> None:
    async with sim() as url, httpx.AsyncClient(base_url=url) as c:
        doc = "lorem ipsum " * 100
        for q in ("first question", "second question"):
            r = await c.post("/v1/completions", json={"model": MODEL, "prompt": doc + q, "max_tokens": 2})
            assert r.status_code == 200
        hits = await metric(c, "vllm:prefix_cache_hits_total")
        queries = await metric(c, "vllm:prefix_cache_queries_total")
    assert queries == 2 * estimate_text_tokens(doc + "first question")
    assert hits == (len(doc) // 4) // 16 * 16


async def test_natural_lengths_respect_min_tokens_and_are_deterministic() -> None:
    async with sim() as url, httpx.AsyncClient(base_url=url) as c:
        body = {"model": MODEL, "prompt": "describe the sea", "max_tokens": 1500, "min_tokens": 300}
        a = (await c.post("/v1/completions", json=body)).json()
        b = (await c.post("/v1/completions", json=body)).json()
    assert a["usage"]["completion_tokens"] >= 300
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


async def test_request_id_header_names_the_response() -> None:
    async with sim() as url, httpx.AsyncClient(base_url=url) as c:
        r = await c.post(
            "/v1/chat/completions",
            headers={"X-Request-Id": "abc123"},
            json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
        )
    assert r.json()["id"] == "chatcmpl-abc123"


async def test_several_engines_in_one_process() -> None:
    async with SimCluster([spec(), spec(), spec()]) as cluster:
        assert len(set(cluster.urls)) == 3
        async with httpx.AsyncClient() as c:
            for url in cluster.urls:
                body = {"model": MODEL, "prompt": "p", "max_tokens": 3}
                r = await c.post(url + "/v1/completions", json=body)
                assert r.status_code == 200
        assert all(e.metrics.success["length"] + e.metrics.success["stop"] == 1 for e in cluster.engines)


@pytest.mark.parametrize("priority_enabled", [False, True])
async def test_priority_field_needs_the_priority_policy(priority_enabled: bool) -> None:
    policy = "priority" if priority_enabled else "fcfs"
    async with sim(scheduling_policy=policy) as url, httpx.AsyncClient(base_url=url) as c:
        r = await c.post(
            "/v1/completions", json={"model": MODEL, "prompt": "p", "max_tokens": 2, "priority": 3}
        )
    assert r.status_code == (200 if priority_enabled else 400)
