"""Following every backend's KV event stream, for the pools that place on them, through the life
of the fleet.

`KVFollower` runs beside the health checker and discovery (router/server.py). Every
`CHECK_EVERY_S`, and at once after a reload, it compares the backends of the current runtime's
followed pools (router/fleet/kvsources.py `followed`) with those it follows: a backend that joined
a pool (listed, or found by discovery, in rotation or still joining) gets a task that finds its
publishers and follows each of its data-parallel ranks into one index
(router/fleet/kvstream.py), published as `pool.kv.streams[backend.name]`, which `precise_prefix`
reads; a backend that left, or whose pool went away or stopped following, has its task cancelled,
which closes its sockets. A reload that keeps a pool and a backend keeps its stream and the index
it built. One ZMQ context serves the process; it is terminated when the follower stops.

Silence is not loss: an idle engine publishes nothing, and its index stays good as long as the
SUB socket holds its connection. A backend is answered None (approximate placement) while its
publishers are not found or not connected, and after a disconnection (the engine went away, or
stopped answering ZMTP heartbeats) until it is back, its index rebuilt from the engine's replay
buffer (router/fleet/kvstream.py `Stream.lost`); an engine that restarted starts its sequence
again, which clears its index; lost batches are asked again of the replay endpoint, and a
replay that fails clears the index, which then fills again from the live stream. A backend down
by its health checks takes no requests at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import orjson
import zmq.asyncio
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.config.models import KVEventsConfig
from router.fleet.kvsources import Listed, Publisher, configured, followed, listed
from router.fleet.kvstream import Stream, follow
from router.fleet.pool import Pool
from router.fleet.probes import INFO_BYTES, ProbeClient
from router.observe.metrics import Metrics
from router.state.runtime import Runtime

log = logging.getLogger("lane_router.kv_events")

CHECK_EVERY_S: Final = 1.0  # how soon a backend that joined or left is followed or let go
ASK_TIMEOUT_S: Final = 5.0
RETRY_FIRST_S: Final = 1.0  # a backend that does not list publishers yet is asked again…
RETRY_MAX_S: Final = 30.0  # …doubling the wait up to this
FAULT_RETRY_S: Final = 5.0  # a backend whose following failed is taken up again after this


@dataclass(eq=False)
class Following:
    """One backend followed: the task, and its ranks' streams once its publishers are known."""

    pool: Pool
    backend: str
    config: KVEventsConfig
    task: asyncio.Task[None] | None = None
    streams: tuple[Stream, ...] = ()
    publishers: tuple[Publisher, ...] = ()


def wanted(runtime: Runtime) -> dict[tuple[str, str], tuple[Pool, KVEventsConfig]]:
    """Every (pool, backend) of the runtime that is to be followed, with how."""
    found: dict[tuple[str, str], tuple[Pool, KVEventsConfig]] = {}
    for name, pool in runtime.pools.items():
        balances = (lane.config.balance for lane in runtime.lanes.values() if lane.pool is pool)
        cfg = followed(pool.config, balances)
        if cfg is None:
            continue
        for backend in pool.members:
            found[(name, backend.name)] = (pool, cfg)
    return found


def _ended(following: Following) -> bool:
    """The backend's task stopped by itself (it only ends by a fault): it is started again, after
    FAULT_RETRY_S."""
    task = following.task
    if task is None or not task.done() or task.cancelled():
        return False
    fault = task.exception()
    log.error(
        "pool %s: following %s's KV events failed; starting again in %.0fs",
        following.pool.name,
        following.backend,
        FAULT_RETRY_S,
        exc_info=fault,
    )
    return True


class KVFollower:
    """Keeps the current runtime's followed backends followed, until stopped."""

    def __init__(
        self, current: Callable[[], Runtime], metrics: Metrics, check_every_s: float = CHECK_EVERY_S
    ) -> None:
        self._current = current
        self._metrics = metrics
        self._check_every_s = check_every_s
        self._following: dict[tuple[str, str], Following] = {}
        self._failed: dict[tuple[str, str], float] = {}  # when following failed (monotonic)
        self._stopping: set[asyncio.Task[None]] = set()
        self._probes = ProbeClient()
        self._ctx: zmq.asyncio.Context | None = None
        self._task: asyncio.Task[None] | None = None
        self._collector = StreamMetrics(lambda: self._following.values())
        metrics.registry.register(self._collector)

    @property
    def following(self) -> dict[tuple[str, str], Following]:
        return self._following

    def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._task = asyncio.create_task(self._loop(), name="lane-router-kv-events")

    async def stop(self) -> None:
        try:
            tasks = [t for t in (self._task, *(f.task for f in self._following.values())) if t is not None]
            for following in list(self._following.values()):
                self._let_go(following)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *self._stopping, return_exceptions=True)
        finally:
            self._metrics.registry.unregister(self._collector)
            await self._probes.aclose()
            if self._ctx is not None:
                self._ctx.term()  # every socket was closed by its task
                self._ctx = None

    async def _loop(self) -> None:
        while True:
            runtime = self._current()
            try:
                self.reconcile(runtime)
            except Exception:  # a fault in one round must not stop the fleet being followed
                log.exception("following the engines' KV events failed this round")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runtime.superseded.wait(), self._check_every_s)

    def reconcile(self, runtime: Runtime) -> None:
        """Follow the backends `wanted` names and no other."""
        want = wanted(runtime)
        self._failed = {key: at for key, at in self._failed.items() if key in want}
        for key, following in list(self._following.items()):
            target = want.get(key)
            if target is None or target[0] is not following.pool or target[1] != following.config:
                self._let_go(following)
            elif _ended(following):
                self._let_go(following)
                self._failed[key] = time.monotonic()
        now = time.monotonic()
        for key, (pool, cfg) in want.items():
            failed = self._failed.get(key)
            if key in self._following or (failed is not None and now - failed < FAULT_RETRY_S):
                continue
            self._failed.pop(key, None)
            self._take_up(pool, key[1], cfg)

    def _take_up(self, pool: Pool, backend: str, cfg: KVEventsConfig) -> None:
        assert self._ctx is not None
        following = Following(pool, backend, cfg)
        following.task = asyncio.create_task(
            self._follow(self._ctx, following), name=f"kv-events {pool.name} {backend}"
        )
        self._following[(pool.name, backend)] = following

    def _let_go(self, following: Following) -> None:
        del self._following[(following.pool.name, following.backend)]
        if following.streams and following.pool.kv.streams.get(following.backend) is following.streams[0]:
            del following.pool.kv.streams[following.backend]
        task = following.task
        if task is not None and not task.done():
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        log.info("pool %s: %s's KV events are no longer followed", following.pool.name, following.backend)

    async def _follow(self, ctx: zmq.asyncio.Context, following: Following) -> None:
        cfg = following.config
        pool = following.pool
        publishers = (
            await self._discover(pool, following.backend)
            if cfg.discovers
            else configured(following.backend, cfg)
        )
        following.publishers = publishers
        index = pool.kv.index()
        streams = tuple(Stream(index=index) for _ in publishers)
        streams[0].peers = streams[1:]
        following.streams = streams
        pool.kv.streams[following.backend] = streams[0]
        log.info(
            "pool %s: following %s's KV events at %s",
            pool.name,
            following.backend,
            ", ".join(p.endpoint for p in publishers),
        )
        await asyncio.gather(
            *(follow(ctx, p.endpoint, p.replay_endpoint, s) for p, s in zip(publishers, streams, strict=True))
        )

    async def _discover(self, pool: Pool, backend: str) -> tuple[Publisher, ...]:
        """The publishers the backend lists, asked until it lists one the router can follow."""
        wait = RETRY_FIRST_S
        said: tuple[str, ...] = ()
        while True:
            found = await self._ask(pool, backend)
            if found.publishers:
                for reason in found.refused:
                    log.warning("pool %s: %s: %s", pool.name, backend, reason)
                return found.publishers
            if found.refused != said:
                why = "; ".join(found.refused)
                log.warning("pool %s: %s's KV events cannot be followed yet: %s", pool.name, backend, why)
                said = found.refused
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)

    async def _ask(self, pool: Pool, backend: str) -> Listed:
        headers = (
            {"authorization": "Bearer " + pool.upstream_key.decode("latin-1")} if pool.upstream_key else {}
        )
        answer = await self._probes.get(
            pool.tls, backend + "/kv_event_sources", cap=INFO_BYTES, timeout=ASK_TIMEOUT_S, headers=headers
        )
        if answer is None:
            return Listed((), ("GET /kv_event_sources got no answer",))
        if answer.status != 200:
            return Listed((), (f"GET /kv_event_sources answered {answer.status}",))
        try:
            body = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            return Listed((), ("GET /kv_event_sources answered no JSON",))
        found = listed(backend, body)
        if not found.publishers and not found.refused:
            return Listed((), ("it lists no KV event publisher (start vLLM with --kv-events-config)",))
        return found


class StreamMetrics(Collector):
    """The followed streams' state, read at each scrape; a backend let go has no series."""

    labelnames = ("pool", "backend")  # of every family, named as router/observe/leanmetrics.py names them

    def __init__(self, followed: Callable[[], Iterable[Following]]) -> None:
        self._followed = followed

    def describe(self) -> Iterable[Metric]:
        return list(_families([]))

    def collect(self) -> Iterable[Metric]:
        return list(_families(self._followed()))


def _families(followed_: Iterable[Following]) -> Iterator[Metric]:
    labels = list(StreamMetrics.labelnames)
    p = "lane_router_kv_events_"
    connected = GaugeMetricFamily(
        p + "connected",
        "1 while the router holds a connection to every publisher of the backend's engine, else 0 "
        "(its requests are then placed by approximation).",
        labels=labels,
    )
    blocks = GaugeMetricFamily(p + "blocks", "Blocks the backend's index holds now.", labels=labels)
    counters = {
        name: CounterMetricFamily(p + name, text, labels=labels)
        for name, text in (
            ("batches", "Event batches applied to the backend's index."),
            ("gaps", "Times batches were found missing and asked again of the replay endpoint."),
            ("resets", "Times the backend's index was cleared: its engine restarted or a replay failed."),
            ("malformed", "Messages of the backend's publishers that could not be decoded."),
        )
    }
    for f in followed_:
        values = [f.pool.name, f.backend]
        streams = f.streams
        connected.add_metric(values, 1.0 if streams and streams[0].all_connected else 0.0)
        blocks.add_metric(values, float(len(streams[0].index)) if streams else 0.0)
        counters["batches"].add_metric(values, float(sum(s.batches for s in streams)))
        counters["gaps"].add_metric(values, float(sum(s.gaps for s in streams)))
        counters["resets"].add_metric(values, float(sum(s.resets for s in streams)))
        counters["malformed"].add_metric(values, float(sum(s.malformed for s in streams)))
    yield connected
    yield blocks
    yield from counters.values()
