"""Several router replicas in front of the same backends, as a scaled-out deployment runs them:
real uvicorn servers on loopback and a real redis-server.

Per-key rate limits and the slow-client memory are shared through Redis; prefix affinity needs no
shared state (rendezvous hashing), which the backends' own record of what they received shows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.config.load import parse_profile
from router.keys.auth import hash_key
from router.server import build_state
from router.state.live import RouterState
from router.state.slots.gate import SharedPoolGate
from tests.proxy.test_slow_clients import TOKENS, finished, read_slowly, stream_body
from tests.proxy.test_slow_clients import shape as slow_shape
from tests.support.fakebackend import Behaviour, FakeBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.redisserver import RedisServer, redis_server
from tests.support.servers import server_group

LIMITED = "limited-key-0123456789"
LIMITED_AUTH = {"authorization": f"Bearer {LIMITED}"}
WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
Shape = Callable[[list[str]], dict[str, Any]]
CHAT = {"class": "chat", "lane": "chat", "pool": "interactive"}


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


@dataclass
class Replica:
    url: str
    state: RouterState

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=10)

    def metric(self, name: str, **labels: str) -> float:
        return self.state.metrics.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def replicas(
    shapes: list[Shape], n_backends: int = 1
) -> AsyncIterator[tuple[list[Replica], list[FakeBackend]]]:
    """One router per shape, all in front of the same backends, each a process of its own as far
    as the router can tell (its own state, metrics and connections)."""
    backends = [FakeBackend() for _ in range(n_backends)]
    async with server_group() as group:
        urls = [await group.start(b) for b in backends]
        routers = []
        for shape in shapes:
            state = build_state(parse_profile(shape(urls)), None)
            routers.append(Replica(await group.serve_router(state), state))
        yield routers, backends


def limited(rpm: int, state: dict[str, Any] | None = None, base: Shape = profile) -> Shape:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = base(urls)
        data["keys"].append({"name": "limited", "sha256": hash_key(LIMITED), "rpm": rpm})
        if state is not None:
            data["state"] = state
        return data

    return shape


async def burst(routers: list[Replica], n: int) -> list[httpx.Response]:
    """`n` requests of the limited key at once, spread over the replicas in turn."""
    clients = [r.client() for r in routers]
    try:
        calls = [
            clients[i % len(clients)].post("/v1/chat/completions", json=WHOLE, headers=LIMITED_AUTH)
            for i in range(n)
        ]
        return await asyncio.gather(*calls)
    finally:
        for c in clients:
            await c.aclose()


async def test_two_replicas_share_one_requests_per_minute_limit(redis: RedisServer) -> None:
    # Six a minute refill one every 10 s: the burst is over long before.
    state = {"redis_url": redis.url, "timeout_s": 5}
    async with replicas([limited(6, state), limited(6, state)]) as (routers, backends):
        responses = await burst(routers, 18)

        ok = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code == 429]
        assert len(ok) == 6 and len(refused) == 12
        assert len(backends[0].seen) == 6
        assert sorted(r.headers["x-ratelimit-remaining-requests"] for r in ok) == list("012345")
        for r in refused:
            assert r.json()["error"]["code"] == "rate_limit_requests"
            assert 1 <= int(r.headers["retry-after"]) <= 10
        # Both replicas served some: the limit is theirs together.
        served = [r.metric("lane_router_requests_total", **CHAT, status="200") for r in routers]
        assert sum(served) == 6 and all(n > 0 for n in served)
        assert len(await connections(redis)) > 1
    # The replicas' shutdown closed their connection pools: only the one asking is left.
    assert len(await connections(redis)) == 1


async def connections(redis: RedisServer) -> list[dict[str, Any]]:
    client = redis.client()
    try:
        found: list[dict[str, Any]] = await client.client_list()
        return found
    finally:
        await client.aclose()


async def test_without_shared_state_each_replica_has_its_own_limit() -> None:
    """The control: the same burst through replicas that keep limits in memory gets twice through."""
    async with replicas([limited(6), limited(6)]) as (routers, backends):
        responses = await burst(routers, 18)
        assert sum(r.status_code == 200 for r in responses) == 12
        assert len(backends[0].seen) == 12


def slow_limited(state: dict[str, Any]) -> Shape:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = slow_shape(urls)
        data["state"] = state
        return data

    return shape


async def test_a_client_marked_slow_by_one_replica_is_slow_stream_on_the_other(redis: RedisServer) -> None:
    state = {"redis_url": redis.url, "timeout_s": 5}
    async with replicas([slow_limited(state), slow_limited(state)]) as ((a, b), backends):
        backend = backends[0]
        backend.behaviour = Behaviour(tokens=TOKENS)
        headers = {**auth("user"), "x-client-id": "phone-7"}
        reading = await read_slowly(a.url, stream_body(), headers, until=finished(backend))
        assert reading.status == 200
        assert a.metric("lane_router_slow_clients_total", lane="chat") == 1

        # The mark reaches Redis in the background; B has never seen this client itself.
        client = redis.client()
        try:
            async with asyncio.timeout(5):
                while not [k async for k in client.scan_iter(match="lane-router:slow:*")]:
                    await asyncio.sleep(0.01)
        finally:
            await client.aclose()
        assert len(b.state.runtime.slow_clients) == 0
        backend.behaviour = Behaviour(tokens=3)
        async with b.client() as http:
            again = await http.post("/v1/chat/completions", content=stream_body(3), headers=headers)
            other = await http.post(
                "/v1/chat/completions",
                content=stream_body(3),
                headers={**auth("user"), "x-client-id": "pc-1"},
            )
        assert again.headers["x-lane-router-class"] == "slow_stream"
        assert again.headers["x-lane-router-reason"] == "slow_client"
        assert other.headers["x-lane-router-class"] == "chat"


async def sharing(routers: list[Replica]) -> None:
    """Until every replica counts in Redis. Building the next replica's state blocks the event
    loop the first one's background work runs on, and may make its first operation time out:
    its rate limits then fail open for `recheck_s`."""

    def shares(r: Replica) -> bool:
        runtime = r.state.runtime
        gate = runtime.pools["interactive"].gate
        assert isinstance(gate, SharedPoolGate) and runtime.shared is not None
        return gate.store.shared_now() and runtime.shared.available()

    async with asyncio.timeout(30):
        while not all(shares(r) for r in routers):
            await asyncio.sleep(0.05)


async def post_limited(router: Replica) -> httpx.Response:
    async with router.client() as http:
        return await http.post("/v1/chat/completions", json=WHOLE, headers=LIMITED_AUTH)


async def test_redis_stopped_mid_run_each_policy_holds_and_redis_back_restores_the_limit(
    redis: RedisServer,
) -> None:
    common = {"redis_url": redis.url, "recheck_s": 0.2, "timeout_s": 2}
    opened = limited(3, {**common, "on_error": "open"})
    closed = limited(3, {**common, "on_error": "closed"})
    async with replicas([opened, closed]) as ((fail_open, fail_closed), backends):
        await sharing([fail_open, fail_closed])
        first = await post_limited(fail_open)
        assert first.status_code == 200 and first.headers["x-ratelimit-remaining-requests"] == "2"

        await redis.stop()
        # Fail-open: admitted, more than the limit allows, uncounted (no remaining-count header).
        during = [await post_limited(fail_open) for _ in range(4)]
        assert [r.status_code for r in during] == [200] * 4
        assert all("x-ratelimit-remaining-requests" not in r.headers for r in during)
        # Each check failed or was skipped: whichever operation met the dead Redis first (the
        # admission counts' heartbeat or re-homing may) starts `recheck_s` of skipped ones.
        acquires = [
            fail_open.metric("lane_router_shared_state_errors_total", op="rate_acquire", reason=reason)
            for reason in ("connection", "backoff")
        ]
        assert sum(acquires) == 4
        # Fail-closed: refused with the documented error; keys without limits are not affected.
        refused = await post_limited(fail_closed)
        assert refused.status_code == 503
        assert refused.json()["error"] == {
            "message": "per-key rate limits cannot be checked: the shared state is unavailable",
            "type": "service_unavailable",
            "code": "rate_limit_state_unavailable",
        }
        assert refused.headers["retry-after"] == "1"
        async with fail_closed.client() as http:
            free = await http.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            health = await http.get("/health")
        assert free.status_code == 200 and health.status_code == 200
        assert fail_closed.metric("lane_router_rejected_total", reason="rate_limit_state_unavailable") == 1

        await redis.start()  # an empty Redis: the key starts again with its full minute
        polls = 1  # fail-open forwards every poll, counted or not
        async with asyncio.timeout(10):
            while "x-ratelimit-remaining-requests" not in (again := await post_limited(fail_open)).headers:
                polls += 1
                await asyncio.sleep(0.05)
            while (back := await post_limited(fail_closed)).status_code != 200:
                await asyncio.sleep(0.05)
        assert again.headers["x-ratelimit-remaining-requests"] == "2"
        assert back.headers["x-ratelimit-remaining-requests"] == "1"
        assert (await post_limited(fail_open)).status_code == 200
        assert (await post_limited(fail_closed)).status_code == 429
        assert len(backends[0].seen) == 1 + 4 + 1 + polls + 2


def rag_shape(urls: list[str]) -> dict[str, Any]:
    data = profile(urls)
    data["lanes"]["rag"]["balance"] = {
        "strategy": "prefix_affinity",
        "slack": 100.0,
    }  # placement by the hash alone
    return data


def document(i: int) -> str:
    return f"document {i}: " + " ".join(f"passage {i}-{w} of the shared context" for w in range(80))


async def test_two_replicas_send_each_prefix_to_the_same_backend_without_shared_state() -> None:
    async with replicas([rag_shape, rag_shape], n_backends=4) as (routers, backends):
        for tag, router, order in (("a", routers[0], range(16)), ("b", routers[1], reversed(range(16)))):
            async with router.client() as http:
                for i in order:
                    body = {**WHOLE, "messages": [{"role": "user", "content": document(i) + " question?"}]}
                    headers = {**auth("tester"), "x-request-class": "rag", "x-request-id": f"{tag}-{i}"}
                    resp = await http.post("/v1/chat/completions", json=body, headers=headers)
                    assert resp.headers["x-lane-router-lane"] == "rag"
        placed: dict[str, int] = {}
        for index, backend in enumerate(backends):
            for seen in backend.seen:
                placed[seen.headers["x-request-id"].removeprefix("tester:")] = index
        assert len(placed) == 32
        assert all(placed[f"a-{i}"] == placed[f"b-{i}"] for i in range(16)), placed
        assert len({placed[f"a-{i}"] for i in range(16)}) >= 3  # spread, not one backend for all
