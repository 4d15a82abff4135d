"""Cache-salted prompts placed precisely: a simulated engine keys a salted prompt's first block
with its salt, as vLLM does, and says so in its KV events; the router, through its own proxy on
loopback, sends a key's requests to the engine holding that key's salted blocks — never crediting
another salt's, or unsalted, blocks of the same prompt."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from router.config.models import KeyConfig
from router.fleet.kvevents import BlockStored, decode_message
from router.fleet.kvindex import BlockIndex
from router.keys.auth import cache_salt, hash_key
from router.lab.sim.kv import KVCacheManager
from router.lab.sim.kv_events import KVEventLog, block_digest, encode_batch
from router.lab.sim.serve import SimCluster
from router.lab.sim.token_ids import text_token_ids
from tests.fleet.test_kvfollow import BLOCK, DOCUMENT, engine, precise_profile, routed_to, router_for
from tests.support.profiles import KEYS, MODEL, auth


def _at_least(n: int) -> Callable[[float | None], bool]:
    return lambda v: (v or 0) >= n


def _salt(key: str) -> str:
    return cache_salt(KeyConfig(name=key, sha256=hash_key(KEYS[key])))


def test_a_salted_prompts_first_block_carries_its_salt_in_hash_and_event() -> None:
    prompt = text_token_ids(DOCUMENT)[: 3 * BLOCK]
    kv = KVCacheManager(64, BLOCK, events=(log := KVEventLog()))
    kv.allocate("a", prompt, salt="tenant-a")
    kv.allocate("b", prompt)
    batch = decode_message((b"kv", (0).to_bytes(8, "big"), encode_batch(0.0, log.take())))
    assert batch is not None
    salted, plain = batch.events
    assert isinstance(salted, BlockStored) and isinstance(plain, BlockStored)
    assert (salted.salt, plain.salt) == ("tenant-a", None)
    assert salted.plain and plain.plain
    assert salted.block_hashes[0] != plain.block_hashes[0]  # vLLM's hash includes the salt
    assert block_digest(None, prompt[:BLOCK], "tenant-a") != block_digest(None, prompt[:BLOCK])
    # A salted prompt finds only its own salt's blocks in the simulator's cache too.
    assert kv.allocate("c", prompt, salt="tenant-b") == 0
    assert kv.allocate("d", prompt, salt="tenant-a") == 3 * BLOCK

    index = BlockIndex()
    index.apply([salted])
    for salt, held in (("tenant-a", 3 * BLOCK), ("tenant-b", 0), (None, 0)):
        assert index.cached_tokens(index.keyer.chain_keys(prompt, BLOCK, salt)) == held


async def test_through_the_router_a_keys_request_reaches_the_engine_holding_its_salted_blocks() -> None:
    async with SimCluster([engine(), engine()], note_deliveries=True) as cluster:
        data = precise_profile(cluster.urls)
        data["prefix_cache_isolation"] = "per_key"
        async with router_for(data) as (state, watch):
            for url in cluster.urls:
                await watch.connected(url)
            system = {"role": "system", "content": DOCUMENT}
            asked = {
                "model": MODEL,
                "messages": [system, {"role": "user", "content": "Who repairs the roof?"}],
            }
            rendezvous = cluster.urls.index(routed_to(state, "chat", asked).name)
            holder = 1 - rendezvous
            earlier = {"model": MODEL, "messages": [system, {"role": "user", "content": "Summarise it."}]}
            # "user"'s salted blocks on one engine; the same prompt's unsalted blocks, and another
            # key's salted ones, on the engine rendezvous hashing picks.
            for at, salt in ((holder, _salt("user")), (rendezvous, None), (rendezvous, _salt("tester"))):
                body = {**earlier, "max_tokens": 2} | ({"cache_salt": salt} if salt else {})
                async with httpx.AsyncClient(base_url=cluster.urls[at], timeout=30) as http:
                    assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
            blocks = len(DOCUMENT) // 4 // BLOCK
            for at, least in ((holder, blocks), (rendezvous, 2 * blocks)):
                await watch.until(
                    "lane_router_kv_events_blocks",
                    _at_least(least),
                    pool="interactive",
                    backend=cluster.urls[at],
                )

            url = watch.router + "/v1/chat/completions"
            before = [len(cluster.deliveries(i)) for i in range(2)]
            for _ in range(3):
                reply = await watch.client.post(url, json={**asked, "max_tokens": 2}, headers=auth("user"))
                assert reply.status_code == 200, reply.text
            sent = [len(cluster.deliveries(i)) - before[i] for i in range(2)]
            assert sent == [3 if i == holder else 0 for i in range(2)]
