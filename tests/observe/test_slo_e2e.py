"""SLO attainment read back from a real `lane-router serve`: a fake backend answers with known
delays, so which requests met their lane's SLO and which bound each missed is known, and
`/metrics` and the access log must count exactly that, clients that leave included. Delays are
seconds against bounds of one second, and prompt answers are instant: a busy machine cannot move
a request across its bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.fakebackend import Behaviour, FakeBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.scaleout import Router, router, write_profile
from tests.support.servers import server_group

LATE_S = 3.0  # a delay three times the bounds below
BOUND_MS = 1000


@pytest.fixture
async def backend() -> AsyncIterator[tuple[FakeBackend, str]]:
    fake = FakeBackend()
    async with server_group() as group:
        yield fake, await group.start(fake)


def slo_profile(url: str) -> dict[str, Any]:
    data = profile([url])
    pool = data["pools"]["interactive"]
    pool.update(response_head_timeout_s=60.0, read_timeout_s=60.0)
    lanes = data["lanes"]
    lanes["chat"]["slo"] = {"ttft_ms": BOUND_MS, "itl_ms": BOUND_MS, "e2e_ms": 30_000}
    lanes["agent"]["slo"] = {"e2e_ms": BOUND_MS}
    lanes["rag"]["slo"] = None  # judged by nothing
    # `batch` states none: its class's default (e2e 120 s).
    return data


async def ask(http: httpx.AsyncClient, fake: FakeBackend, behaviour: Behaviour, **request: Any) -> int:
    """One request under `behaviour`, read to its end; the status the client got."""
    fake.behaviour = behaviour
    cls = request.pop("cls", None)
    headers = auth("tester") | ({"x-request-class": cls} if cls else {})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **request}
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
        await answer.aread()
        return answer.status_code


async def leave(http: httpx.AsyncClient, fake: FakeBackend, behaviour: Behaviour, read_first: bool) -> int:
    """A stream the client leaves: at once, or once its first bytes arrived (late, the backend
    waiting LATE_S before them); returns when the backend saw it go."""
    fake.behaviour = behaviour
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=auth("tester")) as answer:
        if read_first:
            async for _ in answer.aiter_bytes():
                break
    await fake.wait_for(lambda: fake.seen[-1].disconnected is not None, timeout=30)
    return answer.status_code


async def slo_counts(r: Router) -> dict[tuple[str, str, str], float]:
    """(lane, class, verdict) → count; verdict `met` or the `missed` label."""
    found = await r.metrics()
    counts = {(s["lane"], s["class"], "met"): v for s, v in found.get("lane_router_slo_met_total", [])}
    for s, v in found.get("lane_router_slo_missed_total", []):
        counts[(s["lane"], s["class"], s["missed"])] = v
    return counts


async def test_met_and_missed_requests_are_counted_by_lane_class_and_the_bound_missed(
    tmp_path: Path, backend: tuple[FakeBackend, str]
) -> None:
    fake, url = backend
    config = write_profile(tmp_path / "p.yaml", slo_profile(url))
    log = tmp_path / "access.log"
    async with router(config, args=["--access-log", str(log)]) as r, r.client() as http:
        statuses = [
            await ask(http, fake, Behaviour(tokens=4), stream=True),  # met
            await ask(http, fake, Behaviour(tokens=4), stream=False),  # met
            await ask(http, fake, Behaviour(tokens=2, ttft_s=LATE_S), stream=True),  # ttft
            await ask(http, fake, Behaviour(tokens=2, itl_s=LATE_S), stream=True),  # itl
            await ask(http, fake, Behaviour(status=500), stream=True),  # failed
            await ask(http, fake, Behaviour(status=400), stream=False),  # not counted
            await ask(http, fake, Behaviour(tokens=2, ttft_s=LATE_S), stream=False, cls="agent"),  # e2e
            await ask(http, fake, Behaviour(tokens=2), stream=False, cls="agent"),  # met
            await ask(http, fake, Behaviour(tokens=2, ttft_s=LATE_S), stream=True, cls="rag"),  # no SLO
            await ask(http, fake, Behaviour(tokens=2), stream=False, cls="batch"),  # class default: met
            await leave(http, fake, Behaviour(ttft_s=30.0), read_first=False),  # cancelled: not counted
            await leave(http, fake, Behaviour(tokens=3, ttft_s=LATE_S, itl_s=30.0), read_first=True),  # ttft
        ]
        verdicts = [line["slo"] for line in await access_lines(log, len(statuses))]
        counts = await slo_counts(r)
    assert statuses == [200, 200, 200, 200, 500, 400, 200, 200, 200, 200, 200, 200]
    assert counts == {
        ("chat", "chat", "met"): 2,
        ("chat", "chat", "ttft"): 2,
        ("chat", "chat", "itl"): 1,
        ("chat", "chat", "failed"): 1,
        ("agent", "agent", "e2e"): 1,
        ("agent", "agent", "met"): 1,
        ("batch", "batch", "met"): 1,
    }
    assert verdicts == ["met", "met", "ttft", "itl", "failed", None, "e2e", "met", None, "met", None, "ttft"]


async def access_lines(path: Path, count: int) -> list[dict[str, Any]]:
    """The access log's lines once it holds `count` (its writer thread appends them a moment
    after each request ends)."""
    async with asyncio.timeout(30):
        while True:
            text = await asyncio.to_thread(lambda: path.read_bytes() if path.exists() else b"")
            found = [orjson.loads(line) for line in text.splitlines()]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.05)
