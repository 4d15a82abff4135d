"""A reload carries the live counts: requests that started before it count against the limits
after it, so a lane's `max_in_flight` and a pool's prefill limit hold across any number of
reloads, and unchanged backends keep their upstream connections. Against a backend that records
how many requests it holds at every instant."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.fleet.backend import Backend
from router.lanes.lane import Lane
from router.server import build_state
from router.settings import Settings
from router.state.live import RouterState
from tests.support.holdingbackend import HoldingBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import server_group

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Held:
    backend: HoldingBackend
    state: RouterState
    client: httpx.AsyncClient
    path: Path
    data: dict[str, Any]
    reloads: int = 0

    @property
    def lane(self) -> Lane:
        return self.state.runtime.lanes[RequestClass.CHAT]

    @property
    def routed(self) -> Backend:
        return self.state.runtime.pools["interactive"].backends[0]

    def send(self, n: int) -> list[asyncio.Task[httpx.Response]]:
        post = self.client.post
        return [
            asyncio.ensure_future(post("/v1/chat/completions", json=CHAT, headers=auth("user")))
            for _ in range(n)
        ]

    async def reload(self, change: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.reloads += 1
        self.data["profile"] = f"reload-{self.reloads}"
        if change is not None:
            change(self.data)
        self.path.write_text(yaml.safe_dump(self.data))
        resp = await self.client.post("/admin/reload", headers=auth("ops"))
        assert resp.status_code == 200, resp.text


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for router state that no event announces."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def held_stack(tmp_path: Path, **pool: Any) -> AsyncIterator[Held]:
    backend = HoldingBackend()
    async with server_group() as group:
        origin = await group.start(backend)
        data = profile([origin])
        data["pools"]["interactive"].update(pool)
        data["lanes"]["chat"]["max_in_flight"] = 4
        path = tmp_path / "profile.yaml"
        path.write_text(yaml.safe_dump(data))
        state = build_state(parse_profile(data), path)
        url = await group.serve_router(state, Settings(config=path, watch_config=False))
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            yield Held(backend, state, client, path, data)


@pytest.mark.parametrize("reloads", [1, 3])
async def test_a_lane_never_exceeds_max_in_flight_across_reloads(tmp_path: Path, reloads: int) -> None:
    async with held_stack(tmp_path) as h:
        tasks = h.send(4)
        await h.backend.wait_for(lambda: h.backend.held == 4)
        for i in range(1, reloads + 1):
            await h.reload()
            tasks += h.send(4)
            await until(lambda i=i: h.lane.waiting == 4 * i)  # type: ignore[misc]
        assert h.backend.held == 4 and h.lane.in_flight == 4

        h.backend.release(len(tasks))
        answers = await asyncio.gather(*tasks)
        assert h.lane.in_flight == 0 and h.routed.in_flight == 0

    assert [r.status_code for r in answers] == [200] * len(tasks)
    assert h.backend.served == 4 + 4 * reloads
    assert h.backend.peak == 4, h.backend.timeline


async def test_unchanged_backends_keep_their_upstream_connections_across_a_reload(tmp_path: Path) -> None:
    async with held_stack(tmp_path, upstream_keepalive_s=60) as h:

        async def one() -> None:
            h.backend.release()
            (resp,) = await asyncio.gather(*h.send(1))
            assert resp.status_code == 200

        for _ in range(3):
            await one()
        before = set(h.backend.connections)
        await h.reload(lambda d: d["lanes"]["chat"].update(priority=3, max_in_flight=8))
        for _ in range(3):
            await one()
        assert len(before) == 1 and set(h.backend.connections) == before

        # A changed connection setting is what changes: the backend gets a new connection pool.
        await h.reload(lambda d: d["pools"]["interactive"].update(read_timeout_s=7.0))
        await one()
        assert len(set(h.backend.connections)) == 2


async def test_a_reload_applies_new_prefill_limits_to_the_requests_already_counted(tmp_path: Path) -> None:
    async with held_stack(tmp_path, admission={"max_prefilling": 4}) as h:
        h.data["lanes"]["chat"]["max_in_flight"] = None
        await h.reload()
        tasks = h.send(4)
        await h.backend.wait_for(lambda: h.backend.held == 4)
        await h.reload(lambda d: d["pools"]["interactive"].update(admission={"max_prefilling": 2}))
        gate = h.state.runtime.pools["interactive"].gate
        tasks += h.send(1)
        await until(lambda: gate.waiting == 1)

        h.backend.release(2)
        await until(lambda: h.routed.prefilling == 2)
        assert gate.waiting == 1 and h.backend.held == 2  # 2 still prefill: no room under the new limit

        h.backend.release(1)
        await h.backend.wait_for(lambda: h.backend.served == 3 and h.backend.held == 2)
        assert gate.waiting == 0
        h.backend.release(2)
        answers = await asyncio.gather(*tasks)

    assert [r.status_code for r in answers] == [200] * 5
    assert h.backend.peak == 4
