"""LoRA adapters through the router on loopback, in front of fake vLLM backends whose
/v1/models list different adapters: an adapter's requests reach only the backends that hold it,
keep to one of them while its load allows and spill to the next under load; an adapter the
profile names with a path is loaded once, on one backend, however many requests need it, and
only from the profile's path; an adapter no backend lists is a 404 that reaches no backend."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from router.balance.adapter_placement import ADAPTER_MIN_BOUND
from router.balance.prefix_affinity import rendezvous_score
from router.fleet.adapters import AdapterNeed
from router.keys.auth import hash_key
from tests.conftest import Stack, router_stack
from tests.proxy.test_models_routing import EMBED, FAST
from tests.proxy.test_models_routing import _shape as models_shape
from tests.support.profiles import CHAT_MODEL, EMBED_MODEL, KEYS, MODEL, UPSTREAM_KEY, auth, profile

SQL = "sql-lora"
SUPPORT = "support-lora"
SUPPORT_PATH = "/srv/lora/support"


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition the health checker's rounds change (no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def with_adapters(*entries: Any, **key: Any) -> Callable[[list[str]], dict[str, Any]]:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = profile(urls)
        data["pools"]["interactive"]["adapters"] = list(entries)
        data["keys"].append({"name": "sql-only", "sha256": hash_key(KEYS["tester"] + "-sql"), **key})
        return data

    return shape


@contextlib.asynccontextmanager
async def adapters_stack(n: int, *entries: Any, holders: dict[int, list[str]]) -> AsyncIterator[Stack]:
    """`n` fake backends; backend i's /v1/models lists `holders[i]`; the router has learned them."""
    shape = with_adapters(*entries, models=[SQL])
    async with router_stack(n, shape=shape) as stack:
        for i, names in holders.items():
            for name in names:
                stack.backends[i].adapters[name] = f"/lora/{name}"
        backends = stack.state.runtime.pools["interactive"].backends
        await until(
            lambda: all(set(holders.get(i, ())) <= (b.served or set()) for i, b in enumerate(backends))
        )
        yield stack


def counts(stack: Stack) -> list[int]:
    return [len(b.seen) for b in stack.backends]


def rank(stack: Stack, name: str, among: list[int]) -> list[int]:
    key = AdapterNeed(name, None, False).key
    return sorted(among, key=lambda i: rendezvous_score(key, stack.backend_urls[i].rstrip("/")), reverse=True)


async def test_an_adapters_requests_reach_only_its_holders_and_keep_to_one() -> None:
    async with adapters_stack(3, holders={1: [SQL], 2: [SQL]}) as stack, stack.client() as client:
        for _ in range(8):
            resp = await client.post("/v1/chat/completions", json=chat(SQL), headers=auth("user"))
            assert resp.status_code == 200
        first = rank(stack, SQL, [1, 2])[0]
        assert counts(stack)[first] == 8 and sum(counts(stack)) == 8
        assert all(orjson_model(s.body) == SQL for s in stack.seen())
        unknown = await client.post("/v1/chat/completions", json=chat("nope-lora"), headers=auth("user"))
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        assert sum(counts(stack)) == 8


async def test_an_adapter_spills_to_the_next_holder_under_load_and_never_further() -> None:
    async with adapters_stack(3, holders={0: [SQL], 2: [SQL]}) as stack, stack.client() as client:
        hold = asyncio.Event()
        for b in stack.backends:
            b.behaviour.hold = hold
        first, second = rank(stack, SQL, [0, 2])
        sends = []
        try:
            for n in range(1, 13):
                sends.append(
                    asyncio.ensure_future(
                        client.post("/v1/chat/completions", json=chat(SQL), headers=auth("user"))
                    )
                )
                await stack.wait_until(lambda n=n: sum(counts(stack)) == n)  # type: ignore[misc]
            assert counts(stack)[1] == 0
            assert counts(stack)[first] >= ADAPTER_MIN_BOUND and counts(stack)[second] > 0
        finally:
            hold.set()
        assert [r.status_code for r in await asyncio.gather(*sends)] == [200] * 12
        metrics = (await client.get("/metrics", headers=auth("ops"))).text
        assert 'lane_router_adapter_requests_total{placement="preferred",pool="interactive"}' in metrics
        assert 'lane_router_adapter_requests_total{placement="spilled",pool="interactive"}' in metrics


async def test_learned_adapters_come_and_go_with_the_backends_lists() -> None:
    async with adapters_stack(2, holders={}) as stack, stack.client() as client:
        before = await client.post("/v1/chat/completions", json=chat(SQL), headers=auth("user"))
        assert before.status_code == 404 and sum(counts(stack)) == 0
        stack.backends[1].adapters[SQL] = "/lora/sql"
        fleet = stack.state.runtime.fleet
        await until(lambda: SQL in fleet.learned_adapters)
        assert (
            await client.post("/v1/chat/completions", json=chat(SQL), headers=auth("user"))
        ).status_code == 200
        assert counts(stack) == [0, 1]
        report = (await client.get("/admin/lanes", headers=auth("ops"))).json()
        backends = report["pools"]["interactive"]["backends"]
        assert [b["adapters"] for b in backends] == [[], [SQL]]
        del stack.backends[1].adapters[SQL]
        await until(lambda: SQL not in fleet.learned_adapters)
        after = await client.post("/v1/chat/completions", json=chat(SQL), headers=auth("user"))
        assert after.status_code == 404 and after.json()["error"]["code"] == "model_not_found"
        assert counts(stack) == [0, 1]


async def test_a_profile_adapter_no_backend_lists_is_a_404_that_reaches_none() -> None:
    async with adapters_stack(2, SQL, holders={}) as stack, stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(SQL), headers=auth("user"))
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
        assert sum(counts(stack)) == 0


async def test_an_adapter_to_load_is_loaded_once_under_concurrency_and_then_served_there() -> None:
    entry = {"name": SUPPORT, "path": SUPPORT_PATH}
    async with adapters_stack(3, entry, holders={}) as stack, stack.client() as client:
        hold = asyncio.Event()
        for b in stack.backends:
            b.lora_load_hold = hold
        sends = [
            asyncio.ensure_future(
                client.post("/v1/chat/completions", json=chat(SUPPORT), headers=auth("user"))
            )
            for _ in range(10)
        ]
        await stack.wait_until(lambda: sum(len(b.lora_loads) for b in stack.backends) == 1)
        hold.set()
        assert [r.status_code for r in await asyncio.gather(*sends)] == [200] * 10
        loads = [(i, load) for i, b in enumerate(stack.backends) for load in b.lora_loads]
        assert len(loads) == 1
        ((where, load),) = loads
        assert load == {"lora_name": SUPPORT, "lora_path": SUPPORT_PATH}
        assert stack.backends[where].lora_load_auth == [f"Bearer {UPSTREAM_KEY}"]
        assert where == rank(stack, SUPPORT, [0, 1, 2])[0] and counts(stack)[where] == 10
        # Loaded: the next requests go there without another load.
        assert (
            await client.post("/v1/chat/completions", json=chat(SUPPORT), headers=auth("user"))
        ).status_code == 200
        assert sum(len(b.lora_loads) for b in stack.backends) == 1 and counts(stack)[where] == 11
        metrics = (await client.get("/metrics", headers=auth("ops"))).text
        assert 'lane_router_adapter_loads_total{outcome="loaded",pool="interactive"} 1.0' in metrics
        assert 'lane_router_adapter_requests_total{placement="loaded",pool="interactive"} 10.0' in metrics


async def test_a_client_never_makes_the_router_load_anything() -> None:
    entry = {"name": SUPPORT, "path": SUPPORT_PATH}
    async with adapters_stack(2, entry, holders={}) as stack, stack.client() as client:
        unknown = await client.post("/v1/chat/completions", json=chat("evil-lora"), headers=auth("user"))
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        pathed = chat(SUPPORT, lora_path="/etc/passwd")
        refused = await client.post("/v1/chat/completions", json=pathed, headers=auth("user"))
        assert refused.status_code == 400  # a field vLLM does not take
        direct = await client.post(
            "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"}, headers=auth("ops")
        )
        assert direct.status_code == 404
        assert [load for b in stack.backends for load in b.lora_loads] == []
        assert sum(counts(stack)) == 0
        # The profile's adapter is loaded from the profile's path.
        ok = await client.post("/v1/chat/completions", json=chat(SUPPORT), headers=auth("user"))
        assert ok.status_code == 200
        loads = [load for b in stack.backends for load in b.lora_loads]
        assert loads == [{"lora_name": SUPPORT, "lora_path": SUPPORT_PATH}]


async def test_a_failed_load_is_a_clear_502_and_the_request_reaches_no_backend() -> None:
    entry = {"name": SUPPORT, "path": SUPPORT_PATH}
    async with adapters_stack(2, entry, holders={}) as stack, stack.client() as client:
        for b in stack.backends:
            b.lora_load_status = 404
        resp = await client.post("/v1/chat/completions", json=chat(SUPPORT), headers=auth("user"))
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "adapter_load_failed"
        assert SUPPORT_PATH not in resp.text and sum(counts(stack)) == 0


async def test_a_keys_models_scope_names_adapters_and_v1_models_lists_what_it_may_use() -> None:
    async with adapters_stack(2, holders={0: [SQL]}) as stack, stack.client() as client:
        scoped = {"authorization": f"Bearer {KEYS['tester']}-sql"}
        assert (await client.post("/v1/chat/completions", json=chat(SQL), headers=scoped)).status_code == 200
        refused = await client.post("/v1/chat/completions", json=chat(MODEL), headers=scoped)
        assert refused.status_code == 403
        listed = (await client.get("/v1/models", headers=scoped)).json()["data"]
        assert [m["id"] for m in listed] == [SQL] and listed[0]["parent"] == MODEL
        everything = (await client.get("/v1/models", headers=auth("user"))).json()["data"]
        assert {m["id"] for m in everything} == {MODEL, SQL}


def orjson_model(body: bytes) -> str:
    import orjson

    return str(orjson.loads(body)["model"])


async def test_a_learned_adapter_of_another_model_takes_that_models_lanes() -> None:
    async with router_stack(n_backends=4, shape=models_shape) as stack, stack.client() as client:
        # The embedding pool's server lists an adapter of its model (vLLM names the base as parent).
        stack.backends[EMBED].behaviour.model = EMBED_MODEL
        stack.backends[EMBED].adapters["bge-lora"] = "/lora/bge"
        stack.backends[FAST].behaviour.model = CHAT_MODEL
        stack.backends[FAST].adapters["chat-lora"] = "/lora/chat"
        await until(lambda: {"bge-lora", "chat-lora"} <= set(stack.state.runtime.fleet.learned_adapters))
        resp = await client.post(
            "/v1/embeddings", json={"model": "bge-lora", "input": "x"}, headers=auth("user")
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-lane-router-lane"] == "bge:chat"
        assert counts(stack) == [0, 0, 1, 0]
        resp = await client.post("/v1/chat/completions", json=chat("chat-lora"), headers=auth("user"))
        assert resp.status_code == 200 and counts(stack) == [1, 0, 1, 0]


async def test_a_server_cannot_take_another_models_adapter_by_listing_it_for_its_own() -> None:
    async with router_stack(n_backends=4, shape=models_shape) as stack, stack.client() as client:
        stack.backends[FAST].behaviour.model = CHAT_MODEL
        stack.backends[FAST].adapters["chat-lora"] = "/lora/chat"
        fleet = stack.state.runtime.fleet
        await until(lambda: fleet.learned_adapters.get("chat-lora") == CHAT_MODEL)
        # The embedding pool's server lists the same name as an adapter of its own model.
        stack.backends[EMBED].behaviour.model = EMBED_MODEL
        stack.backends[EMBED].adapters["chat-lora"] = "/lora/other"
        embed = stack.state.runtime.pools["embed"].backends[0]
        await until(lambda: ("chat-lora", EMBED_MODEL) in embed.adapters)
        resp = await client.post("/v1/chat/completions", json=chat("chat-lora"), headers=auth("user"))
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
        assert counts(stack)[EMBED] == 0


async def test_an_adapter_listed_with_a_parent_its_pool_does_not_serve_is_not_learned() -> None:
    async with router_stack(n_backends=4, shape=models_shape) as stack, stack.client() as client:
        stack.backends[FAST].behaviour.model = CHAT_MODEL
        stack.backends[FAST].adapters["chat-lora"] = "/lora/chat"
        # A misconfigured embedding server lists the chat model's adapter under another base.
        stack.backends[EMBED].behaviour.model = "a-base"
        stack.backends[EMBED].adapters["chat-lora"] = "/lora/chat"
        stack.backends[EMBED].adapters["stray-lora"] = "/lora/stray"
        embed = stack.state.runtime.pools["embed"].backends[0]
        fast = stack.state.runtime.pools["fast"].backends[0]
        await until(lambda: ("chat-lora", "a-base") in embed.adapters and "chat-lora" in (fast.served or ()))
        resp = await client.post("/v1/chat/completions", json=chat("chat-lora"), headers=auth("user"))
        assert resp.status_code == 200, resp.text
        assert counts(stack) == [1, 0, 0, 0]
        listed = {m["id"] for m in (await client.get("/v1/models", headers=auth("user"))).json()["data"]}
        assert "chat-lora" in listed and "stray-lora" not in listed
