"""Drift — a live server that differs from its pool's profile — is loud: a WARNING per field at
start-up and at each reload, a refusal to start or reload with `health.on_drift: refuse`, and a
live context shorter than the profile's is the one requests are judged against."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import router_stack
from tests.support.fakebackend import FakeBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import free_port, server_group

# The fake backends run vLLM 0.32.0 with max_model_len 2048 (tests/support/fakebackend.py).
LIVE_LEN = 2048


def drifting(urls: list[str], **health: Any) -> dict[str, Any]:
    """One pool whose profile states the default max_model_len (8192) and another version."""
    data = profile(urls)
    pool = data["pools"]["interactive"]
    pool["vllm"] = {"version": "0.31.0"}
    data["health"].update(health)
    return data


def drift_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("drift:")
    ]


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def test_drift_is_a_startup_warning_naming_each_field(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with router_stack(n_backends=1, shape=drifting) as stack:
        # Read as soon as the router listens: the first round ran before it did.
        lines = drift_lines(caplog)
        backend = stack.backend_urls[0]
    assert f"drift: pool interactive backend {backend}: vllm.max_model_len: profile 8192, live 2048" in lines
    assert f"drift: pool interactive backend {backend}: vllm.version: profile 0.31.0, live 0.32.0" in lines


async def test_a_live_context_shorter_than_the_profile_is_the_one_judged() -> None:
    async with router_stack(n_backends=1, shape=drifting) as stack, stack.client() as client:
        models = (await client.get("/v1/models", headers=auth("user"))).json()
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        answer = await client.post("/v1/chat/completions", json=chat, headers=auth("user"))
    assert models["data"][0]["max_model_len"] == LIVE_LEN
    assert answer.status_code == 200
    # The bound the router writes for a request that states none is the pool's context.
    [seen] = stack.seen()
    assert orjson.loads(seen.body)["max_tokens"] == LIVE_LEN


async def test_a_reload_reports_drift_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with router_stack(n_backends=1, shape=drifting, config_dir=tmp_path) as stack:
        assert drift_lines(caplog)
        caplog.clear()
        outcome = await stack.state.reload("test")
        assert outcome.ok
        await until(lambda: len(drift_lines(caplog)) == 2)


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_refuse_keeps_the_router_from_starting(tmp_path: Path, workers: str) -> None:
    config = tmp_path / "profile.yaml"
    async with server_group() as group:
        url = await group.start(FakeBackend())
        config.write_text(yaml.safe_dump(drifting([url], on_drift="refuse")))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "router", "serve", "--config", str(config), "--port", str(free_port()),
            "--workers", workers,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode != 0, text
    assert "on_drift: refuse" in text and "vllm.max_model_len: profile 8192, live 2048" in text
    assert url in text


async def test_refuse_refuses_a_reload_that_drifts(tmp_path: Path) -> None:
    def matching(urls: list[str]) -> dict[str, Any]:
        return drifting(urls, on_drift="refuse") | {"pools": profile(urls)["pools"]}

    async with router_stack(n_backends=1, shape=matching, config_dir=tmp_path) as stack:
        assert stack.config_path is not None
        before = stack.state.runtime
        data = yaml.safe_load(stack.config_path.read_text())
        data["pools"]["interactive"]["vllm"]["max_model_len"] = 4096
        stack.config_path.write_text(yaml.safe_dump(data))
        outcome = await stack.state.reload("test")
        assert not outcome.ok
        assert "vllm.max_model_len: profile 4096, live 2048" in outcome.reason
        assert stack.state.runtime is before

        data["pools"]["interactive"]["vllm"]["max_model_len"] = LIVE_LEN
        stack.config_path.write_text(yaml.safe_dump(data))
        assert (await stack.state.reload("test")).ok
