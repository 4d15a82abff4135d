"""The pools that live runtimes hold, and how their backends come and go without cutting a
request short.

One `Fleet` is shared by a runtime and all its successors (router/state/runtime.py). It knows every
pool some runtime still holds, by name, so a reload finds the pool — and its backends, their
counts and connections — it should reconfigure rather than rebuild. A pool no runtime holds any
more is closed: by then every request that could use it has finished (or outlived the drain
timeout of router/state/live.py).

Members change by reload (a listed pool's `backends`) and by discovery (router/fleet/discovery.py):
`set_members` applies the pure diff of router/fleet/membership.py. A backend that leaves stops taking
requests at once and drains: it is closed and its metric series removed once it is idle — no
request holds it or one of its connections. A connection pool replaced because its settings
changed drains the same way. `sweep` does that closing; it runs whenever a request ends
(router/state/runtime.py `Runtime.leave`), after a reload and after a membership change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from router.fleet.adapterload import AdapterLoads
from router.fleet.backend import Backend, ConnectionSettings, upstream_idle
from router.fleet.membership import diff_members
from router.fleet.pool import Pool
from router.fleet.probes import ProbeClient
from router.observe.metrics import Metrics
from router.proxy.upstream import UpstreamPool

log = logging.getLogger("lane_router.fleet")


class Fleet:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._pools: dict[str, Pool] = {}
        self._draining: set[Pool] = set()  # pools with draining backends
        self._retired: list[UpstreamPool] = []  # replaced connection pools, draining
        self._closing: set[asyncio.Task[None]] = set()
        # Adapters the pools' backends listed, with their parents (router/fleet/health.py keeps
        # it): where a request for a model no pool names may go. Replaced whole.
        self.learned_adapters: dict[str, str] = {}
        self.adapter_loads = AdapterLoads(metrics)  # on-demand loads (router/fleet/adapterload.py)
        # Requests of the router's own to backends on a client's behalf (router/proxy/exactcount.py).
        self.probes = ProbeClient()

    @property
    def pending(self) -> bool:
        """Something drains: `sweep` has work."""
        return bool(self._draining or self._retired)

    def find(self, name: str) -> Pool | None:
        return self._pools.get(name)

    # -- holding --------------------------------------------------------------------------------

    def hold(self, pools: Iterable[Pool]) -> None:
        for pool in pools:
            pool.holders += 1
            self._pools[pool.name] = pool

    async def release(self, pools: Iterable[Pool]) -> None:
        """A runtime is done with its pools; those no runtime holds any more close now."""
        for pool in pools:
            pool.holders -= 1
            if pool.holders == 0:
                await self._close_pool(pool)
        if not self._pools:
            await self.aclose()

    async def _close_pool(self, pool: Pool) -> None:
        if self._pools.get(pool.name) is pool:
            del self._pools[pool.name]
        self._draining.discard(pool)
        backends = (*pool.members, *pool.draining)
        pool.backends = pool.joining = pool.draining = ()
        for backend in backends:
            await self._forget(backend)

    # -- membership -----------------------------------------------------------------------------

    def set_members(self, pool: Pool, origins: Sequence[str], *, probation: bool) -> list[Backend]:
        """Make `origins` the pool's members; the backends added. One that left drains; one that
        comes back while still draining is taken back with its counts. With `probation`
        (discovery) an added backend joins the rotation only once probed healthy (`admit`)."""
        diff = diff_members([b.name for b in pool.members], origins)
        if not diff.added and not diff.vanished:
            return []
        draining: dict[str, Backend] = {b.name: b for b in pool.draining}
        added = [
            draining.pop(origin) if origin in draining else pool.new_backend(origin) for origin in diff.added
        ]
        for backend in added:
            self._reconnect(pool, backend)  # one taken back may predate a settings change
        gone = set(diff.vanished)
        left = [b for b in pool.members if b.name in gone]
        pool.draining = (*draining.values(), *left)
        if probation:
            pool.backends = tuple(b for b in pool.backends if b.name not in gone)
            pool.joining = (*(b for b in pool.joining if b.name not in gone), *added)
        else:
            pool.backends = _by_index([*(b for b in pool.members if b.name not in gone), *added])
            pool.joining = ()
        for backend in left:
            log.info("pool %s: %s (%s) left; it drains", pool.name, backend.label, backend.name)
        for backend in added:
            waits = " once probed healthy" if probation else ""
            log.info("pool %s: %s (%s) joins%s", pool.name, backend.label, backend.name, waits)
        if pool.draining:
            self._draining.add(pool)
        return added

    def admit(self, pool: Pool, backend: Backend) -> None:
        """A joining backend was probed healthy: into the rotation."""
        if backend not in pool.joining:
            return
        pool.joining = tuple(b for b in pool.joining if b is not backend)
        pool.backends = _by_index([*pool.backends, backend])
        log.info("pool %s: %s (%s) is in rotation", pool.name, backend.label, backend.name)
        pool.wake_waiters()

    def wake_waiters(self) -> None:
        """After a reload: queued requests may fit under new limits."""
        for pool in self._pools.values():
            pool.wake_waiters()

    def reconnect(self, pool: Pool) -> None:
        """After the pool's settings changed: members whose connection settings differ get a new
        connection pool; the old one drains."""
        for backend in pool.members:
            self._reconnect(pool, backend)

    def _reconnect(self, pool: Pool, backend: Backend) -> None:
        settings = ConnectionSettings.of(pool.config, pool.tls)
        if backend.connection == settings:
            return
        self._retired.append(backend.upstream)
        backend.upstream = settings.connect(backend.name, backend.label)
        backend.connection = settings

    # -- closing --------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Close what has drained. Needs the running loop."""
        for pool in list(self._draining):
            done = [b for b in pool.draining if b.idle]
            if done:
                pool.draining = tuple(b for b in pool.draining if not b.idle)
                for backend in done:
                    log.info(
                        "pool %s: %s (%s) drained and is forgotten", pool.name, backend.label, backend.name
                    )
                    self._soon(self._forget(backend))
            if not pool.draining:
                self._draining.discard(pool)
        if self._retired:
            done_upstreams = [u for u in self._retired if upstream_idle(u)]
            self._retired = [u for u in self._retired if not upstream_idle(u)]
            for upstream in done_upstreams:
                self._soon(upstream.aclose())

    def _soon(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _forget(self, backend: Backend) -> None:
        try:
            await backend.upstream.aclose()
        finally:
            forget_series(self._metrics, backend.pool, backend.name)

    async def aclose(self) -> None:
        """Close everything still draining (the router stops)."""
        draining = [b for pool in self._draining for b in pool.draining]
        retired, self._retired = self._retired, []
        self._draining.clear()
        # No await in a `finally` of this compiled module (docs/compiled.md): waited on every way out.
        try:
            await self.probes.aclose()
            for backend in draining:
                await self._forget(backend)
            for upstream in retired:
                await upstream.aclose()
        except BaseException as exc:
            await self._closed()
            raise exc  # named, not bare: docs/compiled.md
        await self._closed()

    async def _closed(self) -> None:
        """Until every pool being closed is, and the adapter loads under way have stopped."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self.adapter_loads.aclose()


def _by_index(backends: Iterable[Backend]) -> tuple[Backend, ...]:
    return tuple(sorted(backends, key=lambda b: b.index))


def forget_series(metrics: Metrics, pool: str, backend: str) -> None:
    """Remove a forgotten backend's label series, so a pool whose servers come and go keeps the
    series of its members only (router/observe/metrics.py)."""
    metrics.backend_up.remove(pool, backend)
    metrics.backend_drift.remove(pool, backend)
    errors = metrics.upstream_errors
    reasons = {
        sample.labels["reason"]
        for family in errors.collect()
        for sample in family.samples
        if sample.labels.get("pool") == pool and sample.labels.get("backend") == backend
    }
    for reason in reasons:
        errors.remove(pool, backend, reason)
