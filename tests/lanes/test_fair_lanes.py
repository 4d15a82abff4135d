"""Fair queueing within a lane, through a real router on loopback in front of a backend that
holds every request until the test lets it go and records which key sent each
(tests/support/holdingbackend.py; the router names the key in the request's x-request-id).

The chat lane has 2 slots: whatever else waits, which key's request reaches the backend next is
the order the lane's queue grants its slots in."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.lanes.lane import Lane
from router.server import build_state
from router.settings import Settings
from tests.support.holdingbackend import HoldingBackend
from tests.support.processes import wait_ready
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import server_group

SLOTS = 2
WAIT_S = 60.0
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
FLOOD, QUIET = "user", "tester"  # two keys of the test profile


class Lab:
    def __init__(self, url: str, lane: Lane, backend: HoldingBackend) -> None:
        self.url, self.lane, self.backend = url, lane, backend
        self.client = httpx.AsyncClient(
            base_url=url, timeout=WAIT_S, limits=httpx.Limits(max_connections=200)
        )

    def send(self, key: str, n: int = 1, max_tokens: int = 4) -> list[asyncio.Task[httpx.Response]]:
        body = {**BODY, "max_tokens": max_tokens}
        return [
            asyncio.ensure_future(self.client.post("/v1/chat/completions", json=body, headers=auth(key)))
            for _ in range(n)
        ]

    async def waiting(self, n: int) -> None:
        await until(lambda: self.lane.waiting == n)

    async def next_arrival(self) -> str:
        """Let one held request go; the key of the request the freed slot goes to."""
        seen = len(self.backend.arrivals)
        self.backend.release()
        await self.backend.wait_for(lambda: len(self.backend.arrivals) > seen, WAIT_S)
        return key_of(self.backend.arrivals[seen])


def key_of(request_id: str) -> str:
    return request_id.split(":", 1)[0]


async def samples(lab: Lab, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The router's /metrics samples of one family, by their labels."""
    text = (await lab.client.get("/metrics", headers=auth("scraper"))).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        if f.name == family
        for s in f.samples
    }


async def until(condition: Callable[[], bool]) -> None:
    """Poll router state the test cannot be told about, until it holds."""
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.005)


@pytest.fixture
def keys() -> dict[str, dict[str, Any]]:
    return {}


@pytest.fixture
def chat() -> dict[str, Any]:
    return {}


@pytest.fixture
async def lab(keys: dict[str, dict[str, Any]], chat: dict[str, Any]) -> AsyncIterator[Lab]:
    backend = HoldingBackend()
    async with server_group() as group:
        data = profile([await group.serve(backend)])
        data["lanes"]["chat"].update(max_in_flight=SLOTS, queue_timeout_s=WAIT_S, **chat)
        if "fair_by" in chat:  # every lane of the pool at its priority counts turns alike
            for lane in data["lanes"].values():
                lane["fair_by"] = chat["fair_by"]
        for timeout in ("read_timeout_s", "response_head_timeout_s"):
            data["pools"]["interactive"][timeout] = WAIT_S
        for key in data["keys"]:
            key.update(keys.get(key["name"], {}))
        state = build_state(parse_profile(data), None)
        url = await group.serve_router(state, Settings(watch_config=False))
        await wait_ready(url)
        lab = Lab(url, state.runtime.lanes[RequestClass.CHAT], backend)
        try:
            yield lab
        finally:
            backend.release(10_000)
            await lab.client.aclose()


async def fill(lab: Lab, key: str, queued: int, max_tokens: int = 4) -> list[asyncio.Task[httpx.Response]]:
    """`key` takes both slots and queues `queued` more."""
    tasks = lab.send(key, SLOTS + queued, max_tokens)
    await lab.backend.wait_for(lambda: lab.backend.held == SLOTS, WAIT_S)
    await lab.waiting(queued)
    return tasks


async def finish(lab: Lab, tasks: list[asyncio.Task[httpx.Response]]) -> list[httpx.Response]:
    lab.backend.release(len(tasks))
    return list(await asyncio.gather(*tasks))


async def test_a_quiet_keys_request_takes_the_next_slot_under_another_keys_flood(lab: Lab) -> None:
    flood = await fill(lab, FLOOD, 40)
    (quiet,) = lab.send(QUIET)
    await lab.waiting(41)

    # Within one service time: the first slot the flood frees is the quiet key's, though the
    # flood's 2 requests in flight took their slots before anyone waited.
    assert await lab.next_arrival() == QUIET
    assert {r.status_code for r in await finish(lab, [*flood, quiet])} == {200}


async def test_a_quiet_key_arriving_while_the_flood_drains_takes_the_next_slot(lab: Lab) -> None:
    flood = await fill(lab, FLOOD, 40)
    for _ in range(5):
        assert await lab.next_arrival() == FLOOD
    (quiet,) = lab.send(QUIET)
    await lab.waiting(36)

    assert await lab.next_arrival() == QUIET
    assert {r.status_code for r in await finish(lab, [*flood, quiet])} == {200}


async def test_one_keys_requests_keep_their_order(lab: Lab) -> None:
    """Alone in the lane, a key's waiters are served first come, first served."""
    tasks = lab.send(FLOOD, SLOTS)
    await lab.backend.wait_for(lambda: lab.backend.held == SLOTS, WAIT_S)
    order = []
    for i in range(6):
        order.append(lab.send(FLOOD)[0])
        await lab.waiting(i + 1)  # each queued after the one before
    for _ in order:
        await lab.next_arrival()
    ids = [r.headers["x-request-id"] for r in await finish(lab, tasks + order)]
    assert [key_of(a) + ":" + a.split(":", 1)[1] for a in lab.backend.arrivals[SLOTS:]] == [
        FLOOD + ":" + i for i in ids[SLOTS:]
    ]


@pytest.mark.parametrize("keys", [{FLOOD: {"weight": 3}, QUIET: {"weight": 1}}])
async def test_weights_share_a_saturated_lane_in_their_ratio(lab: Lab) -> None:
    lab.backend.release(10_000)  # answered at once: the lane's 2 slots are what is short
    total, warmup = 440, 40
    clients = 20

    async def client(key: str) -> None:
        while len(lab.backend.arrivals) < total:
            (task,) = lab.send(key)
            assert (await task).status_code == 200

    await asyncio.gather(*(client(k) for k in (FLOOD, QUIET) for _ in range(clients)))

    counts = Counter(key_of(a) for a in lab.backend.arrivals[warmup:total])
    assert counts[FLOOD] + counts[QUIET] == total - warmup
    assert counts[FLOOD] / counts[QUIET] == pytest.approx(3.0, rel=0.10)


@pytest.mark.parametrize("keys", [{QUIET: {"tier": 1}}])
async def test_a_higher_tier_drains_first(lab: Lab) -> None:
    low = await fill(lab, FLOOD, 10)
    high = lab.send(QUIET, 5)
    await lab.waiting(15)
    assert await samples(lab, "lane_router_queue_waiting") == {
        (("lane", "chat"), ("tier", "0")): 10,
        (("lane", "chat"), ("tier", "1")): 5,
    }

    assert [await lab.next_arrival() for _ in range(6)] == [QUIET] * 5 + [FLOOD]
    assert {r.status_code for r in await finish(lab, low + high)} == {200}


@pytest.mark.parametrize(
    ("chat", "order"),
    [
        # By requests, turns alternate once the flood's held slots are behind the quiet key.
        ({}, [QUIET, QUIET, FLOOD, QUIET, FLOOD, QUIET]),
        # By tokens, the flood's requests ask for 100 times the output: the quiet key's five
        # cost less than one of them.
        ({"fair_by": "tokens"}, [QUIET] * 5 + [FLOOD]),
    ],
)
async def test_a_lane_counting_tokens_gives_short_requests_more_turns(lab: Lab, order: list[str]) -> None:
    long = await fill(lab, FLOOD, 10, max_tokens=200)
    short = lab.send(QUIET, 5, max_tokens=2)
    await lab.waiting(15)
    assert [await lab.next_arrival() for _ in range(6)] == order
    assert {r.status_code for r in await finish(lab, long + short)} == {200}


@pytest.mark.parametrize("chat", [{"queue_limit": 10}])
async def test_a_flood_holding_the_whole_queue_gives_a_place_to_another_key(lab: Lab) -> None:
    flood = await fill(lab, FLOOD, 10)
    (more,) = lab.send(FLOOD)
    refused = await more
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"

    (quiet,) = lab.send(QUIET)
    # The flood's newest waiter is refused for it; the lane stays at its limit.
    done, _ = await asyncio.wait(flood, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    (pushed,) = done
    assert pushed.result().status_code == 503 and pushed.result().json()["error"]["code"] == "queue_full"
    assert pushed is flood[-1]
    assert lab.lane.waiting == 10
    assert (await samples(lab, "lane_router_queue_displaced"))[(("lane", "chat"),)] == 1

    assert QUIET in [await lab.next_arrival() for _ in range(SLOTS)]
    rest = [t for t in flood if t is not pushed]
    assert {r.status_code for r in await finish(lab, [*rest, quiet])} == {200}


SERVICE_S = 0.5


@pytest.mark.parametrize("chat", [{"queue_limit": 4}])
async def test_a_full_lanes_retry_after_follows_its_measured_drain(lab: Lab) -> None:
    flood = await fill(lab, FLOOD, 4)
    for _ in range(4):
        # The backend's service time: the pace the lane's queue drains at.
        await asyncio.sleep(SERVICE_S)
        await lab.next_arrival()
        flood += lab.send(FLOOD)
        await lab.waiting(4)

    (more,) = lab.send(FLOOD)
    refused = await more
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
    # Its turn comes after the 4 ahead of it and one more completion, each at least a service
    # time apart: never less, never more than the lane's queue timeout.
    assert 5 * SERVICE_S <= int(refused.headers["retry-after"]) <= WAIT_S
    assert {r.status_code for r in await finish(lab, flood)} == {200}


@pytest.mark.parametrize("chat", [{"queue_limit": 1}])
async def test_a_fast_draining_lane_answers_retry_after_one_second(lab: Lab) -> None:
    lab.backend.release(10_000)  # answered at once: the lane drains as fast as the router goes
    warmup, total = 50, 250
    told: list[str] = []

    async def client() -> None:
        while len(lab.backend.arrivals) < total:
            (task,) = lab.send(FLOOD)
            response = await task
            if response.status_code == 503 and len(lab.backend.arrivals) > warmup:
                assert response.json()["error"]["code"] == "queue_full"
                told.append(response.headers["retry-after"])
            else:
                assert response.status_code in (200, 503)

    await asyncio.gather(*(client() for _ in range(12)))
    assert told and set(told) == {"1"}
