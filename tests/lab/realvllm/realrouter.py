"""The router in front of the real vLLM servers, and the servers' own word on what they did.

The router runs in the test's event loop (on its own HTTP server on loopback, configured as in
production); clients must therefore be asynchronous. Evidence about a request comes from
the vLLM server itself — its Prometheus counters and its access log — never from the router.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from router.config.load import parse_profile
from router.fleet.backend import Health
from router.lab.realvllm.server import VllmServer
from router.observe.observer import build_observer
from router.server import build_state
from router.settings import Settings
from router.state.live import RouterState
from tests.support.profiles import KEYS
from tests.support.servers import server_group


@dataclass(frozen=True)
class Samples:
    """One scrape of a Prometheus endpoint."""

    rows: tuple[tuple[str, dict[str, str], float], ...]

    @classmethod
    def parse(cls, text: str) -> Samples:
        rows = tuple(
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        )
        return cls(rows)

    def matching(self, name: str, **labels: str) -> list[float]:
        """Values of the samples called `name` whose labels include `labels`."""
        return [
            value
            for sample, have, value in self.rows
            if sample == name and all(have.get(k) == v for k, v in labels.items())
        ]

    def total(self, name: str, **labels: str) -> float:
        return sum(self.matching(name, **labels))

    def has(self, name: str, **labels: str) -> bool:
        return bool(self.matching(name, **labels))


# Every request that left the engine, by `finished_reason`: stop, length, abort, error, repetition.
FINISHED = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATED = "vllm:generation_tokens_total"
REJECTED = "vllm:admission_rejections_total"
DRIFT = "lane_router_backend_config_drift"


async def scrape(server: VllmServer, client: httpx.AsyncClient | None = None) -> Samples:
    """The server's own /metrics (open without a key: one of the holes the router closes)."""
    if client is None:
        async with httpx.AsyncClient(timeout=30) as own:
            return await scrape(server, own)
    try:
        resp = await client.get(f"{server.url}/metrics")
    except httpx.RemoteProtocolError:
        # The server closed the kept-alive connection as this scrape went out on it (its idle
        # timeout): the request never reached it, and once more on a new connection is safe.
        resp = await client.get(f"{server.url}/metrics")
    resp.raise_for_status()
    return Samples.parse(resp.text)


async def wait_for(
    server: VllmServer, holds: Callable[[Samples], bool], timeout: float = 10.0, poll: float = 0.02
) -> Samples:
    """Scrape until `holds(samples)`; the last scrape if it never does (the caller asserts). One
    connection serves every scrape: a saturated engine's server is slow to accept new ones."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=30) as client:
        while True:
            samples = await scrape(server, client)
            if holds(samples) or time.monotonic() >= deadline:
                return samples
            await asyncio.sleep(poll)


async def finished(servers: Mapping[str, VllmServer]) -> dict[str, float]:
    return {name: (await scrape(server)).total(FINISHED) for name, server in servers.items()}


async def finished_since(
    servers: Mapping[str, VllmServer], before: Mapping[str, float], expected: int, timeout: float = 10.0
) -> dict[str, float]:
    """Requests each server finished since `before`, once `expected` have finished in all (or at
    the deadline): a server records a request a moment after its response has gone out."""
    deadline = time.monotonic() + timeout
    while True:
        now = await finished(servers)
        deltas = {name: now[name] - before[name] for name in servers}
        if sum(deltas.values()) >= expected or time.monotonic() >= deadline:
            return deltas
        await asyncio.sleep(0.02)


async def wait_idle(server: VllmServer, timeout: float = 30.0) -> None:
    samples = await wait_for(server, lambda s: s.total(RUNNING) + s.total(WAITING) == 0, timeout)
    assert samples.total(RUNNING) + samples.total(WAITING) == 0, f"{server.url} still busy"


_ACCESS = re.compile(r'"([A-Z]+) (\S+) HTTP/1\.[01]" (\d{3})')


class AccessLog:
    """The requests a server logged (uvicorn's access log in the server's own log file).

    `mark()` sends a request with a unique path and waits until the server has logged it, so every
    request the server answered before it is in the log; `since(mark)` lists what came after."""

    def __init__(self, server: VllmServer) -> None:
        self._server = server

    def lines(self) -> list[tuple[str, str, int]]:
        text = self._server.log_path.read_text(errors="replace")
        return [(m[1], m[2], int(m[3])) for m in _ACCESS.finditer(text)]

    async def mark(self, timeout: float = 10.0) -> int:
        path = f"/lane-router-mark-{uuid.uuid4().hex}"
        async with httpx.AsyncClient(timeout=10) as client:
            await client.get(self._server.url + path)
        deadline = time.monotonic() + timeout
        while True:
            seen = self.lines()
            for i, (_, logged, _) in enumerate(seen):
                if logged == path:
                    return i + 1
            assert time.monotonic() < deadline, f"{self._server.url} never logged {path}"
            await asyncio.sleep(0.02)

    async def since(self, mark: int) -> list[tuple[str, str, int]]:
        end = await self.mark()
        return self.lines()[mark : end - 1]


@dataclass
class RealRouter:
    url: str
    state: RouterState

    def openai(self, key: str = "user") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=KEYS[key], max_retries=0, timeout=60)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=60)

    def samples(self) -> Samples:
        return Samples.parse(self.state.metrics.exposition().decode())

    def metric(self, name: str, **labels: str) -> float:
        return self.samples().total(name, **labels)

    async def settled(self, timeout: float = 15.0) -> None:
        """Wait for the first health round: every backend probed up and checked for drift."""
        backends = [(p.name, b) for p in self.state.runtime.pools.values() for b in p.backends]
        deadline = time.monotonic() + timeout
        while True:
            samples = self.samples()
            if all(b.health is Health.UP and samples.has(DRIFT, pool=p, backend=b.name) for p, b in backends):
                return
            assert time.monotonic() < deadline, "the router's first health round did not finish"
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def real_router(
    profile: dict[str, Any], settings: Settings | None = None, config_path: Path | None = None
) -> AsyncIterator[RealRouter]:
    """`settings` may configure tracing or the access log (the router's observer); with
    `config_path` (holding `profile`), `state.reload` re-reads that file as SIGHUP does."""
    settings = settings or Settings(watch_config=False)
    state = build_state(parse_profile(profile), config_path, observer=build_observer(settings))
    async with server_group() as group:
        url = await group.serve_router(state, settings)
        yield RealRouter(url, state)
