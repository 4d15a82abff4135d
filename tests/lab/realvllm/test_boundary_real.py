"""The security boundary against the real hole: every route a vLLM server answers without its
key answers directly, and is 404 through the router — with no key, a user key or an admin key —
or, for the routes the router serves to keys with their scope (`/tokenize`, `/detokenize`), 401
without a key and 403 for keys without the scope; the server's own access log shows the router
never passed it on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.realrouter import AccessLog, RealRouter, real_router
from tests.lab.realvllm.routes import OPEN_ROUTES, ROUTER_OWN
from tests.support.profiles import auth

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

CREDENTIALS = [{}, auth("user"), auth("ops")]
SCOPED = frozenset({"/tokenize", "/detokenize"})
VLLM_ONLY = [
    pytest.param(method, path, body, id=f"{method} {path}")
    for method, path, body in OPEN_ROUTES
    if path not in ROUTER_OWN
]


@pytest.fixture
async def quiet_router(real_pools: RealPools) -> AsyncIterator[RealRouter]:
    """A router whose health checker probes once, at start: after `settled()` nothing it does on
    its own reaches the servers' access logs (the drift check reads /version, a route under test)."""
    health = {"interval_s": 300, "timeout_s": 2.0, "unhealthy_after": 3, "healthy_after": 1}
    async with real_router(real_pools.profile(health=health)) as front:
        await front.settled()
        yield front


@pytest.mark.parametrize(("method", "path", "body"), VLLM_ONLY)
async def test_open_vllm_route_is_unreachable_through_the_router(
    real_pools: RealPools, quiet_router: RealRouter, method: str, path: str, body: dict[str, Any] | None
) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        for name, server in real_pools.servers.items():
            resp = await client.request(method, server.url + path, json=body)
            # Served without a key. (The batch server admits one request at a time, so it may answer
            # 503 to work that fans out into several, such as scoring two items: still no 401.)
            assert resp.status_code == 200 or (name == "batch" and resp.status_code == 503), (
                f"{server.url}{path} without a key: {resp.status_code} {resp.text[:200]}"
            )
    logs = [AccessLog(server) for server in real_pools.servers.values()]
    marks = [await log.mark() for log in logs]
    async with quiet_router.http() as client:
        for headers in CREDENTIALS:
            resp = await client.request(method, path, json=body, headers=headers)
            if path not in SCOPED:
                assert resp.status_code == 404, resp.text[:300]
                assert resp.json()["error"]["code"] == "unknown_route"
            else:
                assert resp.status_code == (403 if headers else 401), resp.text[:300]
    for log, mark in zip(logs, marks, strict=True):
        assert [line for line in await log.since(mark) if line[1] == path] == []


async def test_router_answers_health_and_metrics_itself(
    real_pools: RealPools, quiet_router: RealRouter
) -> None:
    logs = [AccessLog(server) for server in real_pools.servers.values()]
    marks = [await log.mark() for log in logs]
    async with quiet_router.http() as client:
        health = await client.get("/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers=auth("user"))).status_code == 403
        metrics = await client.get("/metrics", headers=auth("ops"))
    assert metrics.status_code == 200
    assert "lane_router_requests_total" in metrics.text
    assert "vllm:" not in metrics.text
    for log, mark in zip(logs, marks, strict=True):
        assert [line for line in await log.since(mark) if line[1] in ROUTER_OWN] == []
