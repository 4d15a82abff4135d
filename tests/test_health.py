"""Backends leave rotation when they fail and come back when they recover."""

from __future__ import annotations

import asyncio

from router.runtime import Health
from tests.conftest import Stack
from tests.profiles import MODEL, auth

WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _until_health(stack: Stack, index: int, state: Health) -> None:
    backend = stack.state.runtime.pools["interactive"].backends[index]
    async with asyncio.timeout(5):
        while backend.health is not state:
            await asyncio.sleep(0.02)


async def test_failing_probe_ejects_and_recovery_readmits(stack: Stack) -> None:
    await _until_health(stack, 0, Health.UP)
    stack.backends[0].healthy = False
    await _until_health(stack, 0, Health.DOWN)
    async with stack.client() as client:
        for _ in range(6):
            assert (
                await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            ).status_code == 200
        assert len(stack.backends[0].seen) == 0 and len(stack.backends[1].seen) == 6
        assert (await client.get("/ready")).status_code == 200
        metrics = (await client.get("/metrics", headers=auth("ops"))).text
        assert (
            f'lane_router_backend_up{{backend="{stack.backend_urls[0]}",pool="interactive"}} 0.0' in metrics
        )

        stack.backends[0].healthy = True
        await _until_health(stack, 0, Health.UP)
        for _ in range(6):
            assert (
                await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            ).status_code == 200
        assert len(stack.backends[0].seen) > 0


async def test_ready_is_503_when_a_lane_has_no_healthy_backend_and_requests_get_503(stack: Stack) -> None:
    await _until_health(stack, 0, Health.UP)
    for b in stack.backends:
        b.healthy = False
    await _until_health(stack, 0, Health.DOWN)
    await _until_health(stack, 1, Health.DOWN)
    async with stack.client() as client:
        ready = await client.get("/ready")
        resp = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
    assert ready.status_code == 503 and ready.json() == {"status": "not_ready"}
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_healthy_backend"
    assert int(resp.headers["retry-after"]) >= 1
    assert stack.forwarded() == 0
