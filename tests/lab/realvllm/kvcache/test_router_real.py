"""Through the router, on two real vLLM servers with small caches publishing KV events: a
`precise_prefix` lane and a `prefix_affinity` lane of one pool, each sent the same kind of
traffic — distinct documents, more than one server's cache holds, cycled — after the servers'
caches were warmed with them by a placement the router did not make (a router restarted, or a
replica added, in front of busy engines). The router subscribes to each engine's publisher as
`GET /kv_event_sources` lists it, works out each prompt's token ids from the model's tokenizer
and chat template, and the hit rates are vLLM's own prefix-cache counters."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from router.fleet.kvstream import Stream
from router.fleet.pool import Pool
from tests.lab.realvllm.conftest import require_install
from tests.lab.realvllm.kvcache.pair import BLOCK, CACHE_BLOCKS, KEY, MODEL, KVPair, pair_vllm
from tests.lab.realvllm.kvcache.workload import (
    FULL_BLOCKS,
    Counters,
    ask,
    counters,
    document,
    token_ids,
    until_held,
)
from tests.lab.realvllm.realrouter import RealRouter, real_router
from tests.support.profiles import auth, profile

# Start-up of the pair is counted in the first test's time, on a host busy with other work.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

DOCS = 8  # FULL_BLOCKS each: 32 blocks, more than one server's 23, fewer than two's
ROUNDS = 2
MIN_TOKENS = 64  # both lanes' affinity key: the document's leading block
LANES = {"chat": "precise_prefix", "rag": "prefix_affinity"}
ESTIMATED = "lane_router_precise_prefix_estimated_total"


def router_profile(kv_pair: KVPair) -> dict[str, Any]:
    """One pool of both servers; the chat lane places precisely, the rag lane approximately."""
    urls = [kv.server.url for kv in kv_pair.servers]
    data = profile(urls, tokenizer=str(require_install().model(MODEL)))
    data["pools"]["interactive"].update(
        model=MODEL,
        upstream_api_key=KEY,
        connect_timeout_s=10.0,
        response_head_timeout_s=120.0,
        read_timeout_s=60.0,
        vllm=pair_vllm(),
    )
    for lane, strategy in LANES.items():
        data["lanes"][lane]["balance"] = {"strategy": strategy, "min_tokens": MIN_TOKENS}
    return data


def pool(front: RealRouter) -> Pool:
    return front.state.runtime.pools["interactive"]


def streams(front: RealRouter) -> dict[str, Stream]:
    return dict(pool(front).kv.streams)


async def subscribed(front: RealRouter, names: list[str], timeout: float = 60.0) -> None:
    """Wait until the router follows each named backend's publisher, connected."""
    deadline = time.monotonic() + timeout
    while True:
        now = streams(front)
        if set(now) == set(names) and all(s.view() is not None for s in now.values()):
            return
        assert time.monotonic() < deadline, f"the router follows {sorted(now)} of {names}"
        await asyncio.sleep(0.02)


@dataclass(frozen=True)
class Run:
    lane: str
    counted: Counters
    most: int  # tokens of full blocks over the run's prompts: every possible hit
    # Each request's document, the server that answered it (0 or 1) and the tokens it hit.
    placed: tuple[tuple[int, int, int], ...]


async def warm(front: RealRouter, kv_pair: KVPair, docs: range, ids: dict[int, list[int]]) -> None:
    """Each document sent straight to one server, alternately — a placement independent of the
    router's — and awaited in the router's index of that server."""
    async with httpx.AsyncClient(timeout=120) as client:
        for doc in docs:
            kv = kv_pair.servers[doc % 2]
            await ask(client, kv, doc)
            assert await until_held(streams(front)[kv.server.url], ids[doc]) == FULL_BLOCKS * BLOCK


async def each(kv_pair: KVPair) -> list[Counters]:
    return [await counters(kv.server) for kv in kv_pair.servers]


def summed(counted: list[Counters]) -> Counters:
    return counted[0] + counted[1]


async def counted_each(kv_pair: KVPair, before: list[Counters], queried: int) -> list[Counters]:
    """Each server's counters since `before`, once `queried` prompt tokens are counted in them
    (a server records a request a moment after its response has gone out)."""
    deadline = time.monotonic() + 30
    while True:
        delta = [now - then for now, then in zip(await each(kv_pair), before, strict=True)]
        if summed(delta).queries >= queried:
            return delta
        assert time.monotonic() < deadline, "the servers did not count the request"
        await asyncio.sleep(0.02)


async def through(front: RealRouter, kv_pair: KVPair, lane: str, docs: range) -> Run:
    """Warm the servers with `docs`, then send each `ROUNDS` times through the router's `lane`."""
    ids = {doc: await token_ids(kv_pair.servers[0].server, document(doc)) for doc in docs}
    assert {len(i) // BLOCK for i in ids.values()} == {FULL_BLOCKS}
    assert DOCS // 2 * (FULL_BLOCKS + 1) <= CACHE_BLOCKS - 1  # half of them fit in one cache
    await warm(front, kv_pair, docs, ids)
    total, most = Counters(0.0, 0.0), 0
    placed: list[tuple[int, int, int]] = []
    headers = {**auth("tester"), "x-request-class": lane}
    async with front.http() as client:
        for doc in [d for _ in range(ROUNDS) for d in docs]:
            before = await each(kv_pair)
            body = {"model": MODEL, "messages": document(doc), "max_tokens": 1}
            resp = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-lane-router-lane"] == lane
            delta = await counted_each(kv_pair, before, len(ids[doc]))
            server = 0 if delta[0].queries else 1
            placed.append((doc, server, int(delta[server].hits)))
            total, most = total + summed(delta), most + FULL_BLOCKS * BLOCK
    return Run(lane, total, most, tuple(placed))


async def test_precise_lane_finds_what_warm_engines_hold_through_the_router(kv_pair: KVPair) -> None:
    async with real_router(router_profile(kv_pair)) as front:
        await front.settled(timeout=60)
        names = [kv.server.url for kv in kv_pair.servers]
        # The router found each engine's publisher at /kv_event_sources and subscribed.
        await subscribed(front, names)
        # Each run its own documents: the other run's are the oldest blocks, evicted first.
        approximate = await through(front, kv_pair, "rag", range(300, 300 + DOCS))
        precise = await through(front, kv_pair, "chat", range(400, 400 + DOCS))
        # No backend was judged by approximation: every placement read both engines' streams.
        assert front.metric(ESTIMATED) == 0
    for run in (approximate, precise):
        c = run.counted
        print(
            f"\n{LANES[run.lane]} ({run.lane} lane, through the router): hit rate {c.rate:.3f} "
            f"({c.hits:.0f}/{c.queries:.0f} tokens; at most {run.most / c.queries:.3f})",
            file=sys.stderr,
        )
        print("  (document, server, tokens hit):", *run.placed, file=sys.stderr)
    # Every full block of every prompt was cached where the precise lane sent it.
    assert precise.counted.hits == precise.most
    assert precise.counted.rate >= approximate.counted.rate
