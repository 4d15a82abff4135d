"""The simulator serves LoRA adapters as vLLM does: listed in /v1/models with their parent,
served like the base model, loaded at run time through /v1/load_lora_adapter (when runtime
updating is on), and a model it does not serve is vLLM's 404."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from router.cli import parse_args
from router.config.load import parse_profile
from router.lab.sim.cli import build_specs, lora_modules
from router.lab.sim.config import EngineConfig
from router.lab.sim.profile import SIM_LORA_ROOT, pool_server
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from tests.lab.sim.test_server import FAST, MODEL
from tests.support.profiles import profile

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@contextlib.asynccontextmanager
async def sim(settings: ServerSettings) -> AsyncIterator[httpx.AsyncClient]:
    config = EngineConfig(
        max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=64, num_gpu_blocks=2048
    )
    engines = SimCluster([EngineSpec(port=0, config=config, timing=FAST, settings=settings)])
    async with engines as cluster, httpx.AsyncClient(base_url=cluster.urls[0], timeout=10) as client:
        yield client


async def listed(client: httpx.AsyncClient) -> dict[str, str | None]:
    return {m["id"]: m["parent"] for m in (await client.get("/v1/models")).json()["data"]}


async def test_adapters_are_listed_with_their_parent_and_served_like_the_model() -> None:
    settings = ServerSettings(served_model_names=(MODEL,), lora_modules=lora_modules(["sql=/lora/sql"]))
    async with sim(settings) as client:
        assert await listed(client) == {MODEL: None, "sql": MODEL}
        resp = await client.post("/v1/chat/completions", json={"model": "sql", **CHAT})
        assert resp.status_code == 200 and resp.json()["model"] == "sql"
        unknown = await client.post("/v1/chat/completions", json={"model": "nope", **CHAT})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"] == "The model `nope` does not exist."
        assert unknown.json()["error"]["type"] == "NotFoundError"
        # Runtime updating off: vLLM does not serve the route at all.
        load = await client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"})
        assert load.status_code == 404


async def test_runtime_loading_adds_an_adapter_once_and_unloading_removes_it() -> None:
    settings = ServerSettings(served_model_names=(MODEL,), runtime_lora=True)
    async with sim(settings) as client:
        assert (await client.post("/v1/chat/completions", json={"model": "sql", **CHAT})).status_code == 404
        load = {"lora_name": "sql", "lora_path": "/lora/sql"}
        assert (await client.post("/v1/load_lora_adapter", json=load)).status_code == 200
        assert await listed(client) == {MODEL: None, "sql": MODEL}
        assert (await client.post("/v1/chat/completions", json={"model": "sql", **CHAT})).status_code == 200
        again = await client.post("/v1/load_lora_adapter", json=load)
        assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
        base = await client.post("/v1/load_lora_adapter", json={"lora_name": MODEL, "lora_path": "/x"})
        assert base.status_code == 400
        assert (await client.post("/v1/load_lora_adapter", json={"lora_name": "y"})).status_code == 400
        assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})).status_code == 200
        assert await listed(client) == {MODEL: None}
        assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})).status_code == 404


def test_a_profiles_pool_serves_its_plain_adapters_and_takes_loads_of_the_others() -> None:
    data = profile(["http://127.0.0.1:9100"])
    data["pools"]["interactive"]["aliases"] = ["fake-alias"]
    data["pools"]["interactive"]["adapters"] = ["sql", {"name": "chat-lora", "path": "/srv/lora/chat"}]
    pool = parse_profile(data).pools["interactive"]
    assert pool.adapters == ("sql", "chat-lora") and pool.adapter_paths == {"chat-lora": "/srv/lora/chat"}
    server = pool_server(pool)
    assert server.served_model_names == ("fake-model", "fake-alias")
    assert server.lora_modules == (("sql", SIM_LORA_ROOT + "sql"),) and server.runtime_lora


def test_the_sim_command_takes_lora_modules_as_vllm_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    args = parse_args(
        ["sim", "--port", "9001", "--served-model-name", "base", "--lora-modules", "a=/l/a", "b=/l/b"]
    )
    (spec,) = build_specs(args)
    assert spec.settings.lora_modules == (("a", "/l/a"), ("b", "/l/b")) and not spec.settings.runtime_lora
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    (spec,) = build_specs(parse_args(["sim", "--port", "9001"]))
    assert spec.settings.runtime_lora
    with pytest.raises(ValueError, match="NAME=PATH"):
        build_specs(parse_args(["sim", "--port", "9001", "--lora-modules", "a"]))
