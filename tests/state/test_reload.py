"""Profile reload: admin API, SIGHUP and file change swap atomically; bad files change nothing."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import yaml

from tests.conftest import Stack, router_stack
from tests.support.fakebackend import Behaviour
from tests.support.profiles import MODEL, auth, profile

STREAM = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _rewrite(path: Path, name: str, backends: list[str]) -> None:
    """Atomic replace, as config management tools do: write aside, rename over."""
    data = profile(backends)
    data["profile"] = name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    os.replace(tmp, path)


async def _profile_name(stack: Stack) -> str:
    async with stack.client() as client:
        resp = await client.get("/admin/lanes", headers=auth("ops"))
    name: str = resp.json()["profile"]
    return name


async def _wait_profile(stack: Stack, name: str) -> None:
    async with asyncio.timeout(5):
        while stack.state.runtime.config.profile != name:
            await asyncio.sleep(0.02)


async def test_reload_under_load_loses_no_request(tmp_path: Path) -> None:
    async with router_stack(config_dir=tmp_path, watch_interval_s=0.05) as stack:
        for b in stack.backends:
            b.behaviour = Behaviour(tokens=20, itl_s=0.005)
        assert stack.config_path is not None
        results: list[tuple[int, str]] = []
        stop = asyncio.Event()

        async def worker() -> None:
            async with stack.client() as client:
                while not stop.is_set():
                    resp = await client.post("/v1/chat/completions", json=STREAM, headers=auth("user"))
                    results.append((resp.status_code, resp.text))

        workers = [asyncio.create_task(worker()) for _ in range(12)]
        try:
            async with stack.client() as admin:
                resp = await admin.post("/admin/reload", headers=auth("ops"))
                assert resp.status_code == 200 and resp.json()["result"] == "reloaded"
            _rewrite(stack.config_path, "by-file", stack.backend_urls)
            await _wait_profile(stack, "by-file")
            before = stack.state.runtime
            os.kill(os.getpid(), signal.SIGHUP)
            async with asyncio.timeout(5):
                while stack.state.runtime is before:
                    await asyncio.sleep(0.02)
            async with asyncio.timeout(30):
                while len(results) < 200:
                    await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.gather(*workers)
        assert len(results) >= 200
        bad = [(s, t[:200]) for s, t in results if s != 200 or not t.endswith("data: [DONE]\n\n")]
        assert bad == []
        assert await _profile_name(stack) == "by-file"
        metrics = stack.state.metrics.exposition().decode()
        assert 'lane_router_config_reloads_total{result="success"} 3.0' in metrics


async def test_an_invalid_file_keeps_the_old_profile_and_says_why(tmp_path: Path) -> None:
    async with router_stack(config_dir=tmp_path, watch_config=False) as stack:
        assert stack.config_path is not None
        data = profile(stack.backend_urls)
        data["lanes"]["chat"]["pool"] = "missing-pool"
        data["pools"]["interactive"]["vllm"]["max_num_seqs"] = 0
        stack.config_path.write_text(yaml.safe_dump(data))
        async with stack.client() as client:
            resp = await client.post("/admin/reload", headers=auth("ops"))
            still = await client.post("/v1/chat/completions", json=STREAM, headers=auth("user"))
        assert resp.status_code == 422
        body = resp.json()
        assert body["error"]["code"] == "invalid_config"
        paths = {i["path"] for i in body["issues"]}
        assert "pools.interactive.vllm.max_num_seqs" in paths
        assert body["profile"] == "test"
        assert still.status_code == 200
        metrics = stack.state.metrics.exposition().decode()
        assert 'lane_router_config_reloads_total{result="failure"} 1.0' in metrics


async def test_sighup_reloads(tmp_path: Path) -> None:
    async with router_stack(config_dir=tmp_path, watch_config=False) as stack:
        assert stack.config_path is not None
        _rewrite(stack.config_path, "after-hup", stack.backend_urls)
        os.kill(os.getpid(), signal.SIGHUP)
        await _wait_profile(stack, "after-hup")
        assert await _profile_name(stack) == "after-hup"
