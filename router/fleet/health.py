"""Backend health: passive ejection on consecutive failures, active probes of `/health` that
re-admit a recovered backend, and a drift check of live servers against their pool's declared
configuration (`/version`, `/v1/models` → `max_model_len`).

The state transitions are plain functions over a `Backend`; `HealthChecker` is the I/O edge. Its
GETs are bounded in time and bytes (`router.fleet.probes`): a backend answering too much or too slowly
fails the probe.

A backend that the pools' discovery (router/fleet/discovery.py, started beside the checker by
router/server.py) finds joins its pool's rotation after its first healthy probe, and that probe
is made the moment it appears (`probe_joined`) rather than at the next interval. A reload wakes
the checker, so the backends it brings are probed at once too."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import orjson

from router.config.models import HealthConfig
from router.fleet.backend import Backend, Health
from router.fleet.pool import Pool
from router.fleet.probes import HEALTH_BYTES, INFO_BYTES, ProbeClient
from router.observe.metrics import Metrics
from router.state.runtime import Runtime

log = logging.getLogger("lane_router.health")


def note_failure(backend: Backend, cfg: HealthConfig, metrics: Metrics) -> None:
    backend.consecutive_successes = 0
    backend.consecutive_failures += 1
    if backend.consecutive_failures >= cfg.unhealthy_after and backend.health is not Health.DOWN:
        _set(backend, Health.DOWN, metrics)


def note_success(backend: Backend) -> None:
    backend.consecutive_failures = 0


def apply_probe(backend: Backend, ok: bool, cfg: HealthConfig, metrics: Metrics) -> None:
    if not ok:
        note_failure(backend, cfg, metrics)
        return
    backend.consecutive_failures = 0
    backend.consecutive_successes += 1
    if backend.health is not Health.UP and backend.consecutive_successes >= cfg.healthy_after:
        _set(backend, Health.UP, metrics)


def _set(backend: Backend, state: Health, metrics: Metrics) -> None:
    if backend.health is not state:
        log.warning("backend %s of pool %s is now %s", backend.name, backend.pool, state.value)
    backend.health = state
    metrics.backend_up.labels(backend.pool, backend.name).set(1 if state is Health.UP else 0)


def drift_findings(pool: Pool, version: str | None, models: dict[str, Any] | None) -> tuple[str, ...]:
    """What a live backend says that contradicts its pool's `vllm:` block."""
    declared = pool.config.vllm
    found: list[str] = []
    if version is not None and version != declared.version:
        found.append(f"version: declared {declared.version}, live {version}")
    if models is not None:
        entries = {m.get("id"): m for m in models.get("data", []) if isinstance(m, dict)}
        entry = entries.get(pool.config.model)
        if entry is None:
            found.append(f"model: {pool.config.model!r} not served (live: {sorted(map(str, entries))})")
        elif "max_model_len" in entry and entry["max_model_len"] != declared.max_model_len:
            found.append(f"max_model_len: declared {declared.max_model_len}, live {entry['max_model_len']}")
    return tuple(found)


class HealthChecker:
    """Probes every backend of the current runtime on an interval, until stopped, and the
    backends discovery finds as they appear."""

    def __init__(self, current: Callable[[], Runtime], metrics: Metrics) -> None:
        self._current = current
        self._metrics = metrics
        self._probes = ProbeClient()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._first_probes: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="lane-router-health")

    def poke(self) -> None:
        """Probe now (after a reload, say) instead of at the next interval."""
        self._wake.set()

    async def stop(self) -> None:
        try:
            tasks = [t for t in (self._task, *self._first_probes) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await self._probes.aclose()

    async def _loop(self) -> None:
        rounds = 0
        while True:
            runtime = self._current()
            await self.probe_all(runtime, check_drift=rounds % 12 == 0)
            rounds += 1
            self._wake.clear()
            await _first_of(self._wake, runtime.superseded, timeout=runtime.config.health.interval_s)

    async def probe_all(self, runtime: Runtime, *, check_drift: bool) -> None:
        jobs = [
            self._probe(runtime, pool, b, check_drift)
            for pool in runtime.pools.values()
            for b in pool.members
        ]
        await asyncio.gather(*jobs)

    def probe_joined(self, pool: Pool, backends: Sequence[Backend]) -> None:
        """Probe backends discovery just found, now: each joins the rotation once healthy."""
        runtime = self._current()
        jobs = (self._probe(runtime, pool, b, check_drift=True) for b in backends)
        task = asyncio.create_task(_gather(jobs), name=f"first-probes-{pool.name}")
        self._first_probes.add(task)
        task.add_done_callback(self._first_probes.discard)

    async def _probe(self, runtime: Runtime, pool: Pool, backend: Backend, check_drift: bool) -> None:
        cfg = runtime.config.health
        answer = await self._probes.get(
            pool.tls, backend.name + "/health", cap=HEALTH_BYTES, timeout=cfg.timeout_s
        )
        if backend not in pool.members:
            return  # it left the pool while the probe ran: no series may outlive it
        ok = answer is not None and answer.status == 200
        apply_probe(backend, ok, cfg, self._metrics)
        if backend.health is Health.UP:
            runtime.fleet.admit(pool, backend)
        if ok and check_drift:
            await self._check_drift(pool, backend, cfg.timeout_s)

    async def _check_drift(self, pool: Pool, backend: Backend, timeout: float) -> None:
        headers = {"authorization": "Bearer " + pool.upstream_key.decode()} if pool.upstream_key else {}
        version = await self._get_json(pool, backend.name + "/version", headers, timeout)
        models = await self._get_json(pool, backend.name + "/v1/models", headers, timeout)
        live_version = version.get("version") if isinstance(version, dict) else None
        backend.drift = drift_findings(pool, live_version, models if isinstance(models, dict) else None)
        if backend in pool.members:
            self._metrics.backend_drift.labels(pool.name, backend.name).set(1 if backend.drift else 0)

    async def _get_json(self, pool: Pool, url: str, headers: dict[str, str], timeout: float) -> Any:
        answer = await self._probes.get(pool.tls, url, cap=INFO_BYTES, timeout=timeout, headers=headers)
        if answer is None or answer.status != 200:
            return None
        try:
            return orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            return None


async def _gather(jobs: Iterable[Awaitable[None]]) -> None:
    await asyncio.gather(*jobs)


async def _first_of(*events: asyncio.Event, timeout: float) -> None:
    """Until one of the events is set, or `timeout` seconds."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
