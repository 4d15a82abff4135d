"""Precise placement against approximate on two real vLLM servers whose caches are warm with
documents this router did not place (a router restarted, or a replica added, in front of busy
engines): `precise_prefix` learns what each engine holds from its KV events (the late
subscriber's replay), `prefix_affinity` can only hash. Placement is by the lanes' own balancers
(router/balance registry); the hit rates are vLLM's own prefix-cache counters."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import httpx
import orjson
import pytest

from router.balance import AffinityRequest, BalanceHooks, affinity_for, make_balancer
from router.balance.settings import PrecisePrefixSettings, PrefixAffinitySettings, StrategySettings
from router.fleet.kvcaches import KVCaches
from router.request.facts import parse_facts
from router.request.tokens import SimulatorCounter
from tests.lab.realvllm.kvcache.pair import BLOCK, CACHE_BLOCKS, KVPair, KVServer
from tests.lab.realvllm.kvcache.workload import (
    FULL_BLOCKS,
    Counters,
    ask,
    counted,
    counters,
    document,
    following,
    token_ids,
    until_held,
)

DOCS = 8  # FULL_BLOCKS each: 32 blocks, more than one server's 23, fewer than two's
ROUNDS = 3
MIN_TOKENS = 64  # the affinity key: the document's leading block

# Start-up of the pair is counted in the first test's time, on a host busy with other work.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]


@dataclass(frozen=True)
class Backend:
    """A balancer's candidate: the server's name, nothing in flight (one request at a time)."""

    name: str
    in_flight: int = 0
    load_score: float = 0.0


@dataclass(frozen=True)
class Run:
    strategy: str
    counted: Counters
    most: int  # the tokens of full blocks over the run's prompts: every possible hit

    @property
    def best_rate(self) -> float:
        return self.most / self.counted.queries


def chain(doc: int) -> tuple[bytes, ...]:
    body = orjson.dumps({"model": "tiny", "messages": document(doc)})
    return parse_facts("chat", body, SimulatorCounter()).prefix_chain


async def warm(servers: tuple[KVServer, KVServer], docs: range, caches: KVCaches) -> None:
    """Each document sent straight to one server, alternately — a placement independent of
    this router's hashing — and awaited in the index of the server that stored it."""
    async with httpx.AsyncClient(timeout=120) as client:
        for doc in docs:
            kv = servers[doc % 2]
            await ask(client, kv, doc)
            await until_held(caches.streams[kv.server.url], await token_ids(kv.server, document(doc)))


async def placed(kv_pair: KVPair, settings: StrategySettings, docs: range) -> Run:
    """Warm the servers with `docs`, then send each document `ROUNDS` times where the lane's
    balancer places it; vLLM's counters over the placed requests."""
    servers = kv_pair.servers
    by_name = {kv.server.url: kv for kv in servers}
    ids = {doc: await token_ids(servers[0].server, document(doc)) for doc in docs}
    # Half the documents, the partial blocks included, fit in one server's cache.
    assert {len(i) // BLOCK for i in ids.values()} == {FULL_BLOCKS}
    assert DOCS // 2 * (FULL_BLOCKS + 1) <= CACHE_BLOCKS - 1
    caches = KVCaches()
    balancer = make_balancer(settings, BalanceHooks(cached_tokens=caches.cached_tokens))
    candidates = [Backend(name) for name in by_name]
    total = Counters(0.0, 0.0)
    most = 0
    async with following(servers[0]) as a, following(servers[1]) as b:
        caches.streams.update({servers[0].server.url: a, servers[1].server.url: b})
        await warm(servers, docs, caches)
        async with httpx.AsyncClient(timeout=120) as client:
            for doc in [d for _ in range(ROUNDS) for d in docs]:
                request = AffinityRequest(chain(doc), None, None, MIN_TOKENS, token_ids=ids[doc])
                kv = by_name[balancer.pick(candidates, affinity_for(settings, request)).name]
                before = await counters(kv.server)
                await ask(client, kv, doc)
                total = total + await counted(kv.server, before, len(ids[doc]))
                most += len(ids[doc]) // BLOCK * BLOCK
    return Run(settings.strategy, total, most)


async def test_precise_placement_finds_what_warm_engines_hold(kv_pair: KVPair) -> None:
    # Each run its own documents: the other run's are the oldest blocks, evicted first.
    approximate = await placed(kv_pair, PrefixAffinitySettings(min_tokens=MIN_TOKENS), range(100, 100 + DOCS))
    precise = await placed(kv_pair, PrecisePrefixSettings(min_tokens=MIN_TOKENS), range(200, 200 + DOCS))
    for run in (approximate, precise):
        print(
            f"\n{run.strategy}: hit rate {run.counted.rate:.3f} "
            f"({run.counted.hits:.0f}/{run.counted.queries:.0f} tokens; at most {run.best_rate:.3f})",
            file=sys.stderr,
        )
    # Every full block of every placed prompt was cached where precise placement sent it.
    assert precise.counted.hits == precise.most
    assert precise.counted.rate >= approximate.counted.rate
