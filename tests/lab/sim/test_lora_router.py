"""The router in front of simulated vLLM servers serving different LoRA adapters: an adapter's
requests reach only the servers listing it, an adapter the profile names with a path is loaded
on one server through its /v1/load_lora_adapter and served there."""

from __future__ import annotations

import asyncio
import time

import httpx

from router.config.load import parse_profile
from router.lab.sim.config import EngineConfig
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.server import build_state
from tests.lab.sim.test_server import FAST
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import server_group

CONFIG = EngineConfig(max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=64, num_gpu_blocks=2048)


def engine(*modules: tuple[str, str]) -> EngineSpec:
    settings = ServerSettings(served_model_names=(MODEL,), lora_modules=modules, runtime_lora=True)
    return EngineSpec(port=0, config=CONFIG, timing=FAST, settings=settings)


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def listed(url: str) -> set[str]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return {m["id"] for m in (await client.get("/v1/models")).json()["data"]}


async def test_adapters_reach_only_the_simulated_servers_that_serve_them() -> None:
    specs = [engine(("sql", "/lora/sql")), engine(), engine()]
    async with SimCluster(specs, note_deliveries=True) as cluster, server_group() as group:
        data = profile(cluster.urls)
        data["pools"]["interactive"]["adapters"] = [{"name": "support", "path": "/srv/lora/support"}]
        state = build_state(parse_profile(data), None)
        router = await group.serve_router(state)
        backends = state.runtime.pools["interactive"].backends
        deadline = time.monotonic() + 10
        while not all(b.served for b in backends):  # the first probe round's lists
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient(base_url=router, timeout=10) as client:
            for _ in range(5):
                resp = await client.post("/v1/chat/completions", json=chat("sql"), headers=auth("user"))
                assert resp.status_code == 200 and resp.json()["model"] == "sql"
            assert [len(cluster.deliveries(i)) for i in range(3)] == [5, 0, 0]
            sends = [
                client.post("/v1/chat/completions", json=chat("support"), headers=auth("user"))
                for _ in range(4)
            ]
            assert [r.status_code for r in await asyncio.gather(*sends)] == [200] * 4
            holders = [i for i, url in enumerate(cluster.urls) if "support" in await listed(url)]
            assert len(holders) == 1
            (holder,) = holders
            assert len(cluster.deliveries(holder)) == 4 + (5 if holder == 0 else 0)
            unknown = await client.post("/v1/chat/completions", json=chat("nope"), headers=auth("user"))
            assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
            assert sum(len(cluster.deliveries(i)) for i in range(3)) == 9
