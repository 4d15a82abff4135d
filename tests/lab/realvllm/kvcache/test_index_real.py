"""The router's block index of a real vLLM, fed by its KV event stream (router/fleet/kvstream.py),
holds exactly what the engine's prefix cache holds: before every request it predicts the hits
vLLM itself then counts, through evictions of a cache smaller than the documents sent; and a
subscriber that joins late rebuilds the same index from the engine's replay endpoint."""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import pytest

from tests.lab.realvllm.kvcache.pair import BLOCK, CACHE_BLOCKS, KVPair
from tests.lab.realvllm.kvcache.workload import (
    ask,
    counted,
    counters,
    document,
    following,
    held,
    token_ids,
    until_held,
)

DOCS = 8
REQUESTS = 24

# Start-up of the pair is counted in the first test's time, on a host busy with other work.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]


def seeded_order() -> Iterator[int]:
    rnd = random.Random(36)
    return (rnd.randrange(DOCS) for _ in range(REQUESTS))


async def test_the_index_predicts_the_engines_own_hits_through_evictions(kv_pair: KVPair) -> None:
    kv = kv_pair.servers[0]
    ids = {d: await token_ids(kv.server, document(d)) for d in range(DOCS)}
    assert sum(len(i) // BLOCK for i in ids.values()) > CACHE_BLOCKS  # the documents outgrow the cache
    predicted: list[tuple[int, int, float]] = []
    async with following(kv) as stream, httpx.AsyncClient(timeout=120) as client:
        for doc in seeded_order():
            expected = held(stream, ids[doc])
            before = await counters(kv.server)
            await ask(client, kv, doc)
            delta = await counted(kv.server, before, len(ids[doc]))
            predicted.append((doc, expected, delta.hits))
            # Its blocks were just stored: the next prediction waits until the index has them.
            assert await until_held(stream, ids[doc]) == len(ids[doc]) // BLOCK * BLOCK
        assert len(stream.index) < CACHE_BLOCKS  # evictions left the index
        assert stream.index.skipped == 0
    assert [(d, float(p)) for d, p, _ in predicted] == [(d, h) for d, _, h in predicted]
    seen: set[int] = set()
    evicted = 0
    for doc, expected, _ in predicted:
        evicted += doc in seen and expected == 0
        seen.add(doc)
    assert evicted > 0, "no document sent before was ever evicted: the cache did not overflow"
    assert any(p > 0 for _, p, _ in predicted), "no request was ever a hit"


async def test_a_late_subscriber_rebuilds_the_index_from_the_replay(kv_pair: KVPair) -> None:
    kv = kv_pair.servers[1]
    ids = {d: await token_ids(kv.server, document(d)) for d in range(DOCS)}
    async with following(kv) as early, httpx.AsyncClient(timeout=120) as client:
        for doc in range(DOCS // 2):
            await ask(client, kv, doc)
            await until_held(early, ids[doc])
        async with following(kv) as late:
            # The first live batch the late subscriber sees makes it replay the history before it.
            await ask(client, kv, DOCS // 2)
            await until_held(early, ids[DOCS // 2])
            await until_held(late, ids[DOCS // 2])
            assert late.resets == 0
            assert {d: held(late, i) for d, i in ids.items()} == {d: held(early, i) for d, i in ids.items()}
            assert sum(held(late, i) > 0 for i in ids.values()) > 1
