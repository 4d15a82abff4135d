"""Elastic pools: every pool with `discovery:` has the servers its DNS name lists.

Each discovery pool of the current runtime has its own task, which resolves the name
(router/fleet/resolver.py) at once and then every `interval_s`, and again at once after a reload. A
good answer becomes the pool's members (router/fleet/fleet.py `set_members`): the lowest
`max_backends` addresses, so every router replica picks the same ones; an address new to the
pool joins it after its first healthy probe (`on_joined` asks router/fleet/health.py for one at once);
one that vanished drains.

A failed resolution — a timeout, a server failure, NXDOMAIN, or a name with no addresses — keeps
the last good members. An empty member list can only turn a resolution problem into an outage,
while a member whose server is really gone is taken out of rotation by its failing health
probes anyway; a name that does not answer, or answers NXDOMAIN or nothing, cannot be told apart
from a DNS hiccup or a Service briefly without ready endpoints (a rolling restart). Each failure
is counted (`lane_router_discovery_errors_total{pool,reason}`); an outage is logged when it
starts and when it ends. A pool that never had a good answer has no backends and is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from router.config.models import DiscoveryConfig
from router.fleet.backend import Backend
from router.fleet.membership import backend_origin, choose_addresses
from router.fleet.pool import Pool
from router.fleet.resolver import ResolveFailed, resolve
from router.observe.metrics import Metrics
from router.state.runtime import Runtime

log = logging.getLogger("lane_router.discovery")

Resolve = Callable[[DiscoveryConfig], Awaitable[tuple[str, ...]]]
OnJoined = Callable[[Pool, Sequence[Backend]], None]


class Discovery:
    """Keeps the current runtime's discovery pools resolved, until stopped."""

    def __init__(
        self,
        current: Callable[[], Runtime],
        metrics: Metrics,
        on_joined: OnJoined,
        resolver: Resolve = resolve,
    ) -> None:
        self._current = current
        self._metrics = metrics
        self._on_joined = on_joined
        self._resolve = resolver
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="lane-router-discovery")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._watchers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchers.clear()

    async def _follow(self) -> None:
        """One watcher per discovery pool of the current runtime, checked again on each reload."""
        while True:
            runtime = self._current()
            for name, pool in runtime.pools.items():
                task = self._watchers.get(name)
                if pool.config.discovery is not None and (task is None or task.done()):
                    self._watchers[name] = asyncio.create_task(self._watch(name), name=f"discovery-{name}")
            await runtime.superseded.wait()

    async def _watch(self, name: str) -> None:
        while True:
            runtime = self._current()
            pool = runtime.pools.get(name)
            if pool is None or pool.config.discovery is None:
                return
            try:
                await self.refresh(pool)
            except Exception:  # a fault in one answer must not stop the pool following its name
                log.exception("pool %s: applying what %s answered failed", name, pool.config.discovery.dns)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runtime.superseded.wait(), pool.config.discovery.interval_s)

    async def refresh(self, pool: Pool) -> None:
        """Resolve the pool's name once and apply the answer."""
        cfg = pool.config.discovery
        if cfg is None:
            return
        try:
            addresses = await self._resolve(cfg)
        except ResolveFailed as failed:
            self._failed(pool, cfg, failed)
            return
        if self._current().pools.get(pool.name) is not pool or pool.config.discovery != cfg:
            return  # a reload replaced the pool or its discovery while the name was resolving
        chosen, truncated = choose_addresses(addresses, cfg.max_backends)
        self._succeeded(pool, cfg, len(set(addresses)), truncated)
        origins = [backend_origin(address, cfg.port, cfg.scheme) for address in chosen]
        joined = self._current().fleet.set_members(pool, origins, probation=True)
        if pool.draining:
            self._current().fleet.sweep()
        if joined:
            self._on_joined(pool, joined)

    def _failed(self, pool: Pool, cfg: DiscoveryConfig, failed: ResolveFailed) -> None:
        self._metrics.discovery_errors.labels(pool.name, failed.reason).inc()
        if pool.discovery.failed(failed.reason, time.time()):
            log.warning(
                "pool %s: resolving %s failed (%s: %s); keeping its %d backend(s) until it answers",
                pool.name,
                cfg.dns,
                failed.reason,
                failed,
                len(pool.members),
            )

    def _succeeded(self, pool: Pool, cfg: DiscoveryConfig, count: int, truncated: bool) -> None:
        now = time.time()
        ended, began = pool.discovery.succeeded(count, truncated, now)
        self._metrics.discovery_truncated.labels(pool.name).set(1 if truncated else 0)
        if ended is not None:
            log.warning(
                "pool %s: %s answers again after %.1fs (%d failed resolution(s), first: %s)",
                pool.name,
                cfg.dns,
                now - ended.since,
                ended.failures,
                ended.reason,
            )
        if began:
            log.warning(
                "pool %s: %s has %d addresses, above discovery.max_backends (%d): the lowest %d are used",
                pool.name,
                cfg.dns,
                count,
                cfg.max_backends,
                cfg.max_backends,
            )
