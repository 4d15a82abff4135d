"""The router follows its engines' KV event streams through the life of the fleet: a real router
on loopback in front of simulated vLLM servers that publish their KV events over ZMQ
(router/lab/sim/kv_publisher.py), each listing its publisher at GET /kv_event_sources. A prompt
is served by an engine directly, so the test decides which engine caches it; the router learns
it only from the engine's events."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
import zmq
from prometheus_client.parser import text_string_to_metric_families

from router.balance import AffinityRequest, affinity_for
from router.config.load import parse_profile
from router.fleet.backend import Backend
from router.lab.procs import free_ports
from router.lab.sim.config import EngineConfig
from router.lab.sim.kv import KVCacheManager
from router.lab.sim.kv_events import KVEventLog, encode_batch
from router.lab.sim.kv_publisher import KVEventsConfig, ZmqKVEventPublisher
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.token_ids import text_token_ids
from router.lanes.lane import Lane
from router.proxy.handler import affinity_for as handler_affinity
from router.proxy.handler import engine_token_ids
from router.request.facts import parse_facts
from router.request.fields import Endpoint
from router.request.tokens import Counters, make_counter
from router.server import build_state
from router.state.live import RouterState
from tests.lab.sim.test_server import FAST
from tests.support.dnsmasq import DOMAIN, dnsmasq
from tests.support.fakebackend import FakeBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import free_port, running, server_group

BLOCK = 16
CONFIG = EngineConfig(
    max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=64, num_gpu_blocks=2048, block_size=BLOCK
)
DOCUMENT = " ".join(f"Clause {i}: the tenant keeps the premises in good repair." for i in range(40))
WAIT_S = 30.0
NAME = f"engines.{DOMAIN}"


def engine(port: int = 0, kv_ports: tuple[int, int] = (0, 0)) -> EngineSpec:
    """A simulated server publishing its KV events on every interface (`tcp://*:PORT`, as vLLM
    must be started for a router to subscribe); port 0: one the system picks."""
    kv = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"tcp://*:{kv_ports[0]}",
        replay_endpoint=f"tcp://*:{kv_ports[1]}",
    )
    settings = ServerSettings(served_model_names=(MODEL,))
    return EngineSpec(port=port, config=CONFIG, timing=FAST, settings=settings, kv_events=kv)


def precise_profile(urls: list[str]) -> dict[str, Any]:
    """The simulator's token rule, so the router works out the ids its engines compute."""
    data = profile(urls, tokenizer="simulator")
    for lane in ("chat", "rag", "agent", "slow_stream"):
        data["lanes"][lane]["balance"] = "precise_prefix"
    return data


def prompt(question: str) -> str:
    """The document and a question, as a completion prompt of whole 4-character chunks (the
    simulator's tokens: router/lab/sim/token_ids.py)."""
    text = f"{DOCUMENT} {question}"
    return text + " " * (-len(text) % 4)


def pick(lane: Lane, text: str) -> Backend:
    """Where the lane's balancer places this completion prompt now, keyed as the router keys it."""
    body = {"model": MODEL, "prompt": text}
    facts = parse_facts("completions", orjson.dumps(body), Counters({}, make_counter(None)))
    request = AffinityRequest(
        chain=facts.prefix_chain,
        user=None,
        session=None,
        default_min_tokens=64,
        token_ids=text_token_ids(text),
    )
    return lane.balancer.pick(lane.pool.routable(), affinity_for(lane.config.balance, request))


async def serve_directly(url: str, text: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        reply = await http.post("/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 2})
        assert reply.status_code == 200


Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: httpx.AsyncClient, router: str) -> Samples:
    text = (await client.get(router + "/metrics", headers=auth("scraper"))).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


class Watch:
    """The router's /metrics, polled until a sample says what the test waits for."""

    def __init__(self, client: httpx.AsyncClient, router: str) -> None:
        self.client = client
        self.router = router

    async def get(self, name: str, **labels: str) -> float | None:
        return value(await scrape(self.client, self.router), name, **labels)

    async def until(self, name: str, test: Callable[[float | None], bool], **labels: str) -> None:
        async def holds() -> bool:
            return test(await self.get(name, **labels))

        await until(holds, f"{name}{labels}")

    async def connected(self, backend: str, up: bool = True) -> None:
        await self.until(
            "lane_router_kv_events_connected",
            lambda v: v == (1.0 if up else 0.0),
            pool="interactive",
            backend=backend,
        )


def write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data))


@contextlib.asynccontextmanager
async def router_for(
    data: dict[str, Any], path: Path | None = None
) -> AsyncIterator[tuple[RouterState, Watch]]:
    async with server_group() as group, httpx.AsyncClient(timeout=30) as client:
        if path is not None:
            write(path, data)
        state = build_state(parse_profile(data), path)
        router = await group.serve_router(state)
        yield state, Watch(client, router)


async def test_a_prompt_goes_to_the_engine_holding_its_prefix_where_rendezvous_picks_another() -> None:
    async with (
        SimCluster([engine(), engine()]) as cluster,
        router_for(precise_profile(cluster.urls)) as (state, watch),
    ):
        for url in cluster.urls:
            await watch.connected(url)
        lane = state.runtime.lanes["chat"]
        question = prompt("Who repairs the roof?")
        rendezvous = pick(lane, question)  # nothing cached anywhere: rendezvous decides
        (holder,) = [url for url in cluster.urls if url != rendezvous.name]

        await serve_directly(holder, prompt("Summarise the lease."))
        shared_blocks = len(DOCUMENT) // 4 // BLOCK
        await watch.until(
            "lane_router_kv_events_blocks",
            lambda v: (v or 0) >= shared_blocks,
            pool="interactive",
            backend=holder,
        )

        assert pick(lane, question).name == holder
        cached = lane.pool.kv.cached_tokens(cluster.urls, text_token_ids(question))
        held = cached[holder]
        assert held is not None and held >= shared_blocks * BLOCK
        assert cached[rendezvous.name] == 0
        # Every backend was judged on what its engine holds: none by approximation.
        assert await watch.get("lane_router_precise_prefix_estimated_total", pool="interactive") == 0
        assert (
            await watch.get("lane_router_kv_events_batches_total", pool="interactive", backend=holder) or 0
        ) > 0


async def test_a_lost_publisher_is_placed_by_approximation_and_a_restarted_engine_starts_empty() -> None:
    ports = free_ports(6)
    kv_ports = [(ports[2], ports[3]), (ports[4], ports[5])]
    urls = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    gone = urls[1]
    data = precise_profile(urls)
    # Probed once, before the router listens: the engine that goes away stays a candidate, so
    # placement has to judge it without its stream.
    data["health"]["interval_s"] = 3600
    leaving = SimCluster([engine(ports[1], kv_ports[1])])
    await leaving.start()
    try:
        async with SimCluster([engine(ports[0], kv_ports[0])]), router_for(data) as (state, watch):
            await watch.connected(gone)
            await serve_directly(gone, prompt("Summarise the lease."))
            await watch.until(
                "lane_router_kv_events_blocks", lambda v: (v or 0) > 0, pool="interactive", backend=gone
            )
            await leaving.stop()
            await watch.connected(gone, up=False)

            lane = state.runtime.lanes["chat"]
            assert [b.name for b in lane.pool.routable()] == urls
            ids = text_token_ids(prompt("Who repairs the roof?"))
            assert lane.pool.kv.cached_tokens(urls, ids) == {urls[0]: 0, gone: None}
            pick(lane, prompt("Who repairs the roof?"))
            estimated = await watch.get("lane_router_precise_prefix_estimated_total", pool="interactive")
            assert estimated == 1

            # The engine comes back, restarted: nothing it held before is credited to it.
            async with SimCluster([engine(ports[1], kv_ports[1])]):
                await watch.connected(gone)
                await serve_directly(gone, "An unrelated question, asked twenty times over. " * 20)
                await watch.until(
                    "lane_router_kv_events_blocks",
                    lambda v: (v or 0) > 0,
                    pool="interactive",
                    backend=gone,
                )
                assert lane.pool.kv.cached_tokens(urls, ids)[gone] == 0
                resets = await watch.get(
                    "lane_router_kv_events_resets_total", pool="interactive", backend=gone
                )
                assert resets == 1
    finally:
        await leaving.stop()


async def test_reloads_follow_backends_that_join_and_leave_and_keep_the_index_of_those_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "profile.yaml"
    async with SimCluster([engine(), engine()]) as cluster:
        kept, joining = cluster.urls
        async with router_for(precise_profile([kept]), path) as (state, watch):
            await watch.connected(kept)
            await serve_directly(kept, prompt("Summarise the lease."))
            await watch.until(
                "lane_router_kv_events_blocks", lambda v: (v or 0) > 0, pool="interactive", backend=kept
            )
            pool = state.runtime.pools["interactive"]
            stream = pool.kv.streams[kept]
            blocks = len(stream.index)

            write(path, precise_profile([kept, joining]))
            assert (await state.reload("test")).ok
            await watch.connected(joining)
            assert pool.kv.streams[kept] is stream and len(stream.index) == blocks
            admin = await watch.client.get(watch.router + "/admin/lanes", headers=auth("ops"))
            listed = {b["url"]: b.get("kv_events") for b in admin.json()["pools"]["interactive"]["backends"]}
            assert listed[kept] == {"connected": True, "blocks": blocks}

            write(path, precise_profile([kept]))
            assert (await state.reload("test")).ok
            await watch.until(
                "lane_router_kv_events_connected", lambda v: v is None, pool="interactive", backend=joining
            )
            assert set(pool.kv.streams) == {kept} and pool.kv.streams[kept] is stream

            # A pool whose lanes no longer place on token ids stops following its engines.
            plain = profile([kept])
            write(path, plain)
            assert (await state.reload("test")).ok
            await watch.until(
                "lane_router_kv_events_connected", lambda v: v is None, pool="interactive", backend=kept
            )
            assert pool.kv.streams == {}


async def test_through_the_router_a_request_reaches_the_engine_that_cached_its_prefix() -> None:
    specs = [engine(), engine()]
    async with (
        SimCluster(specs, note_deliveries=True) as cluster,
        router_for(precise_profile(cluster.urls)) as (state, watch),
    ):
        for url in cluster.urls:
            await watch.connected(url)
        question = prompt("Who repairs the roof?")
        rendezvous = pick(state.runtime.lanes["chat"], question)  # where nothing cached sends it
        holder = 1 - cluster.urls.index(rendezvous.name)
        await serve_directly(cluster.urls[holder], prompt("Summarise the lease."))
        await watch.until(
            "lane_router_kv_events_blocks",
            lambda v: (v or 0) >= len(DOCUMENT) // 4 // BLOCK,
            pool="interactive",
            backend=cluster.urls[holder],
        )

        for _ in range(3):
            body = {"model": MODEL, "prompt": question, "max_tokens": 2}
            reply = await watch.client.post(watch.router + "/v1/completions", json=body, headers=auth("user"))
            assert reply.status_code == 200, reply.text
        # Deliveries are the requests that carried the router's x-request-id: the three sent through it.
        assert [len(cluster.deliveries(i)) for i in range(2)] == [3 if i == holder else 0 for i in range(2)]


def stored(rank: int, token_ids: list[int]) -> bytes:
    """A batch of a real block manager storing `token_ids` (whole blocks), from `rank`."""
    log = KVEventLog()
    KVCacheManager(64, BLOCK, events=log).allocate(rank, token_ids)
    return encode_batch(1.0, log.take(), data_parallel_rank=rank)


def two_ranks(attempts: int = 20) -> tuple[list[ZmqKVEventPublisher], int, int]:
    """Two data-parallel ranks' publishers, rank r on port + r: free ports are picked one by one,
    so port + 1 may be taken by another process; such a pick is given up for another."""
    for _ in range(attempts):
        pub, replay = free_ports(2)
        ranks: list[ZmqKVEventPublisher] = []
        try:
            for rank in range(2):
                config = KVEventsConfig(
                    enable_kv_cache_events=True,
                    endpoint=f"tcp://*:{pub}",
                    replay_endpoint=f"tcp://*:{replay}",
                )
                ranks.append(ZmqKVEventPublisher(config.for_server(rank)))
        except zmq.ZMQError:
            for publisher in ranks:
                publisher.close()
            continue
        return ranks, pub, replay
    raise AssertionError(f"no two free pairs of consecutive ports in {attempts} picks")


async def test_every_data_parallel_rank_of_a_backend_feeds_its_one_index() -> None:
    ranks, pub, replay = two_ranks()
    prompts = [text_token_ids(prompt(f"Question {rank} of the rank.")) for rank in range(2)]
    try:
        async with running(FakeBackend()) as url:
            data = precise_profile([url])
            data["pools"]["interactive"]["kv_events"] = {
                "port": pub,
                "replay_port": replay,
                "data_parallel_size": 2,
            }
            async with router_for(data) as (state, watch):
                await watch.connected(url)
                kv = state.runtime.pools["interactive"].kv
                for rank, publisher in enumerate(ranks):
                    publisher.publish(stored(rank, prompts[rank]))

                async def both_held() -> bool:
                    # A batch sent before the subscription reached the publisher is lost; the
                    # next one reveals the gap and the replay brings it back.
                    for rank, publisher in enumerate(ranks):
                        publisher.publish(encode_batch(2.0, [], data_parallel_rank=rank))
                    held = [kv.cached_tokens([url], ids)[url] or 0 for ids in prompts]
                    return all(h >= len(ids) // BLOCK * BLOCK for h, ids in zip(held, prompts, strict=True))

                await until(both_held, "both ranks' blocks in the backend's index")
                ranks.pop().close()  # rank 1 goes away: the backend is no longer known
                await watch.connected(url, up=False)
                assert kv.cached_tokens([url], prompts[0]) == {url: None}
    finally:
        for publisher in ranks:
            publisher.close()


async def test_discovery_brings_backends_whose_streams_are_followed_and_let_go(tmp_path: Path) -> None:
    """Simulated servers on 127.0.0.1 and 127.0.0.2 at one port, found by a real dnsmasq; each
    lists its own publisher (on a port of its own) at /kv_event_sources."""
    port = free_port()
    specs = [dataclasses.replace(engine(port), host=host) for host in ("127.0.0.1", "127.0.0.2")]
    origins = [f"http://{host}:{port}" for host in ("127.0.0.1", "127.0.0.2")]
    async with dnsmasq(tmp_path) as dns, SimCluster(specs):
        dns.set_hosts({NAME: ["127.0.0.1"]})
        data = precise_profile(["http://127.0.0.1:1"])
        pool = data["pools"]["interactive"]
        del pool["backends"]
        pool["discovery"] = {"dns": NAME, "port": port, "interval_s": 0.2, "nameservers": [dns.nameserver]}
        async with router_for(data) as (state, watch):
            await watch.connected(origins[0])
            dns.set_hosts({NAME: ["127.0.0.1", "127.0.0.2"]})
            await watch.connected(origins[1])
            kv = state.runtime.pools["interactive"].kv
            await serve_directly(origins[1], prompt("Summarise the lease."))
            ids = text_token_ids(prompt("Who repairs the roof?"))

            async def held() -> bool:
                return (kv.cached_tokens(origins, ids)[origins[1]] or 0) > 0

            await until(held, "the discovered backend's blocks indexed")

            dns.set_hosts({NAME: ["127.0.0.1"]})
            await watch.until(
                "lane_router_kv_events_connected", lambda v: v is None, pool="interactive", backend=origins[1]
            )
            assert set(kv.streams) == {origins[0]}


async def test_a_backend_listing_no_publisher_is_asked_again_until_its_engine_publishes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    silent = SimCluster([dataclasses.replace(engine(port), kv_events=None)])
    async with silent, router_for(precise_profile([url])) as (state, watch):
        await until(
            lambda: _said(caplog, "lists no KV event publisher"), "the backend without events is reported"
        )
        assert await watch.get("lane_router_kv_events_connected", pool="interactive", backend=url) == 0
        ids = text_token_ids(prompt("Who repairs the roof?"))
        assert state.runtime.pools["interactive"].kv.cached_tokens([url], ids) == {url: None}
        await silent.stop()  # restarted with its KV events on
        async with SimCluster([engine(port)]):
            await watch.connected(url)


async def _said(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


def routed_to(state: RouterState, endpoint: Endpoint, body: dict[str, Any]) -> Backend:
    """Where the chat lane would place this body now, keyed and tokenized as the handler does."""
    runtime = state.runtime
    lane = runtime.lanes["chat"]
    facts = parse_facts(endpoint, orjson.dumps(body), runtime.counters)
    ids = engine_token_ids(runtime.counters.get(MODEL), facts, None)
    return lane.balancer.pick(lane.pool.routable(), handler_affinity(lane, facts, runtime, token_ids=ids))


async def test_a_chat_request_reaches_the_engine_holding_its_conversations_blocks() -> None:
    async with (
        SimCluster([engine(), engine()], note_deliveries=True) as cluster,
        router_for(precise_profile(cluster.urls)) as (state, watch),
    ):
        for url in cluster.urls:
            await watch.connected(url)
        system = {"role": "system", "content": DOCUMENT}
        asked = {"model": MODEL, "messages": [system, {"role": "user", "content": "Who repairs the roof?"}]}
        rendezvous = routed_to(state, "chat", asked)
        holder = 1 - cluster.urls.index(rendezvous.name)
        earlier = {"model": MODEL, "messages": [system, {"role": "user", "content": "Summarise it."}]}
        async with httpx.AsyncClient(base_url=cluster.urls[holder], timeout=30) as http:
            assert (
                await http.post("/v1/chat/completions", json={**earlier, "max_tokens": 2})
            ).status_code == 200
        await watch.until(
            "lane_router_kv_events_blocks",
            lambda v: (v or 0) >= len(DOCUMENT) // 4 // BLOCK,
            pool="interactive",
            backend=cluster.urls[holder],
        )

        url = watch.router + "/v1/chat/completions"
        for _ in range(3):
            reply = await watch.client.post(url, json={**asked, "max_tokens": 2}, headers=auth("user"))
            assert reply.status_code == 200, reply.text
        assert [len(cluster.deliveries(i)) for i in range(2)] == [3 if i == holder else 0 for i in range(2)]
