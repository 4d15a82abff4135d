"""The engines' KV events on the virtual clock: what the router's view holds of each engine."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from router.fleet.kvcaches import KVCaches
from router.lab.bench.kvfeed import KVFeed
from router.lab.sim import kv_events as sim
from router.lab.sim.config import EngineConfig
from router.lab.sim.kv import chain_hashes
from router.lab.sim.timing import StepTimeModel
from router.lab.sim.token_ids import chat_token_ids
from router.lab.sim.vclock import BackendState, Change, TraceRequest, VirtualBackend, VirtualCluster

TIMING = StepTimeModel(c0=0.005, c_prefill=1e-4, c_decode=1e-3, c_ctx=1e-6, frontend_s=0.002)
# Small caches: the run evicts, so the view must follow removals as well as stores.
CONFIG = EngineConfig(max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=16, num_gpu_blocks=300)


def documents(n: int, rng: random.Random) -> list[str]:
    return ["".join(rng.choice("abcdefgh ") for _ in range(rng.randrange(800, 2400))) for _ in range(n)]


def trace(n: int, seed: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    docs = documents(12, rng)
    out = []
    for i in range(n):
        text = rng.choice(docs) + f" question {i}?"
        body = {
            "model": "sim-model",
            "messages": [{"role": "system", "content": "Be brief. é"}, {"role": "user", "content": text}],
            "max_tokens": 8,
            "ignore_eos": True,
        }
        out.append(TraceRequest(f"r-{i}", 0.05 * i, body, "chat"))
    return out


def scattered(states: Sequence[BackendState], req: TraceRequest) -> int:
    return states[int(req.request_id[2:]) * 7 % len(states)].index


def test_the_routers_view_equals_the_engines_cached_blocks_after_a_run() -> None:
    backends = [VirtualBackend(f"http://e{i}", "p", CONFIG, TIMING) for i in range(3)]
    caches = KVCaches()
    feed = KVFeed([b.name for b in backends], [caches] * 3, delay=0.004)
    requests = trace(160, seed=5)
    # Backend 1 leaves mid-run and comes back restarted; backend 2 joins late.
    changes = (Change(2.0, 2, up=True), Change(3.0, 1, up=False), Change(6.5, 1, up=True))
    cluster = VirtualCluster(backends, members=feed, changes=changes, absent=(2,))
    cluster.run(requests, scattered)
    feed.advance(math.inf)

    assert feed.batches > 0
    assert sum(e.kv.evictions for e in cluster.engines) > 0
    for backend, engine in zip(backends, cluster.engines, strict=True):
        view = caches.streams[backend.name].view()
        assert view is not None
        assert len(view) == sum(1 for _ in engine.kv.index_items())
        for req in requests:
            prompt = chat_token_ids(req.body["messages"])
            held = len(engine.kv.match_prefix(chain_hashes(prompt, CONFIG.block_size))) * CONFIG.block_size
            assert view.cached_tokens(caches.keyer.chain_keys(prompt, CONFIG.block_size)) == held


def test_a_steps_events_reach_the_view_after_the_publication_delay() -> None:
    caches = KVCaches()
    feed = KVFeed(["http://e0"], [caches], delay=0.01)
    feed.joined(0, 0.0)
    log = sim.KVEventLog()
    tokens = list(range(16))
    log.stored(sim.block_digest(None, tokens), None, tokens, 16)
    feed.published(0, log.take(), 1.0)
    stream = caches.streams["http://e0"]
    keys = caches.keyer.chain_keys(tokens, 16)

    feed.advance(1.0 + 0.009)
    assert stream.index.cached_tokens(keys) == 0
    feed.advance(1.0 + 0.01)
    assert stream.index.cached_tokens(keys) == 16


def test_a_backend_that_joins_is_judged_by_approximation_until_its_subscriber_connects() -> None:
    caches = KVCaches()
    feed = KVFeed(["http://e0", "http://e1"], [caches, caches], connect=0.5)
    feed.joined(0, 0.0)
    feed.joined(1, 4.0)
    feed.advance(4.2)
    both = caches.cached_tokens(["http://e0", "http://e1"], list(range(32)))
    assert both == {"http://e0": 0, "http://e1": None}
    feed.advance(4.5)
    assert caches.cached_tokens(["http://e1"], list(range(32))) == {"http://e1": 0}
    feed.left(1, 9.0)
    assert "http://e1" not in caches.streams
