"""Backend health: passive ejection on consecutive failures, active probes of `/health` that
re-admit a recovered backend, and a drift check of live servers against their pool's declared
configuration (`/version`, `/v1/models` → `max_model_len`; router/config/drift.py).

Drift is logged as a WARNING per field, naming the pool, backend, profile value and live value:
at start-up (the first round runs before the router listens), after a reload, and whenever a
backend's findings change. With `health.on_drift: refuse` the router refuses to start, and a
reload is refused, while a backend drifts (`refusal`, `reload_drift`). A pool whose servers run a
shorter `max_model_len` than the profile states is judged against the live one: the output bound
the router writes, the tokens it charges and the context /v1/models shows (`judge_context`).

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
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from router.config.drift import Drift, drift_of, live_max_model_len, served_adapters, served_entries
from router.config.models import HealthConfig, PoolConfig, ProfileConfig
from router.fleet.adapters import learned_parents
from router.fleet.backend import Backend, Health
from router.fleet.pool import Pool
from router.fleet.probes import HEALTH_BYTES, INFO_BYTES, ProbeClient
from router.observe.metrics import Metrics
from router.state.runtime import Runtime
from router.tls.contexts import TlsFileError
from router.tls.upstream import UpstreamTls, upstream_tls

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


def note_schedule(runtime: Runtime, now: float) -> None:
    """Tell each pool when its backends are probed next, for the Retry-After of a request no
    backend can take now (router/lanes/poolgate.py)."""
    cfg = runtime.config.health
    for pool in runtime.pools.values():
        pool.next_round_at = now + cfg.interval_s
        pool.round_s = cfg.interval_s
        pool.rounds_to_rejoin = cfg.healthy_after


def drift_line(pool: str, backend: str, drift: Drift) -> str:
    return f"pool {pool} backend {backend}: {drift}"


def report_drift(pool: Pool, backend: Backend, found: tuple[Drift, ...], *, announce: bool) -> None:
    """Log a backend's drift when it changed, or when `announce` (start-up, reload, a new backend)."""
    lines = tuple(map(str, found))
    if lines == backend.drift and not announce:
        return
    for drift in found:
        log.warning("drift: %s", drift_line(pool.name, backend.name, drift))
    if not found and backend.drift:
        log.info("pool %s backend %s matches its profile again", pool.name, backend.name)


def judge_context(runtime: Runtime, pool: Pool) -> None:
    """Judge the pool's requests against the shortest context its servers run, when that is
    shorter than the profile's `max_model_len`: a backend refuses what does not fit anyway."""
    live = [b.live_max_model_len for b in pool.members if b.live_max_model_len is not None]
    shortest = min(live) if live else None
    if shortest == pool.live_max_model_len:
        return
    pool.live_max_model_len = shortest
    declared = pool.config.vllm.max_model_len
    if shortest is not None and shortest < declared:
        log.warning(
            "pool %s: requests are judged against max_model_len %d, its servers', not the profile's %d",
            pool.name,
            shortest,
            declared,
        )
    for lane in runtime.lanes.values():
        if lane.pool is pool:
            lane.settings.max_model_len = pool.max_model_len


def refusal(runtime: Runtime) -> str | None:
    """Why the router may not run this runtime (`health.on_drift: refuse` and a backend drifts)."""
    if runtime.config.health.on_drift != "refuse":
        return None
    lines = [
        f"pool {pool.name} backend {b.name}: {finding}"
        for pool in runtime.pools.values()
        for b in pool.members
        for finding in b.drift
    ]
    if not lines:
        return None
    return "the live servers differ from the profile (health.on_drift: refuse): " + "; ".join(lines)


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
        self._checked: Runtime | None = None  # the runtime whose drift was last checked in full

    async def first_round(self) -> str | None:
        """Probe every backend and check its drift now, before the router listens; why the
        router must not start, if it must not (`refusal`)."""
        runtime = self._current()
        await self.probe_all(runtime, check_drift=True)
        return refusal(runtime)

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
            if rounds > 0 or runtime is not self._checked:
                # A new runtime (a reload) has its drift checked, and reported, at once.
                await self.probe_all(runtime, check_drift=rounds % 12 == 0 or runtime is not self._checked)
            rounds += 1
            self._wake.clear()
            note_schedule(runtime, time.monotonic())
            await _first_of(self._wake, runtime.superseded, timeout=runtime.config.health.interval_s)

    async def probe_all(self, runtime: Runtime, *, check_drift: bool) -> None:
        announce = check_drift and runtime is not self._checked
        if check_drift:
            self._checked = runtime
        jobs = [
            self._probe(runtime, pool, b, check_drift, announce)
            for pool in runtime.pools.values()
            for b in pool.members
        ]
        await asyncio.gather(*jobs)
        reindex_adapters(runtime)  # a reload's pools and backends, and those that left

    def probe_joined(self, pool: Pool, backends: Sequence[Backend]) -> None:
        """Probe backends discovery just found, now: each joins the rotation once healthy."""
        runtime = self._current()
        jobs = (self._probe(runtime, pool, b, check_drift=True, announce=True) for b in backends)
        task = asyncio.create_task(_gather(jobs), name=f"first-probes-{pool.name}")
        self._first_probes.add(task)
        task.add_done_callback(self._first_probes.discard)

    async def _probe(
        self, runtime: Runtime, pool: Pool, backend: Backend, check_drift: bool, announce: bool
    ) -> None:
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
            await self._check_drift(runtime, pool, backend, cfg.timeout_s, announce)
        elif ok:
            await self._learn_models(runtime, pool, backend, cfg.timeout_s)

    async def _check_drift(
        self, runtime: Runtime, pool: Pool, backend: Backend, timeout: float, announce: bool
    ) -> None:
        version, models = await live_facts(self._probes, pool.tls, backend.name, pool.upstream_key, timeout)
        if backend not in pool.members:
            return
        learn_models(runtime, backend, models)
        found = drift_of(pool.config, version, models)
        report_drift(pool, backend, found, announce=announce)
        backend.drift = tuple(map(str, found))
        backend.live_max_model_len = live_max_model_len(pool.config, models)
        self._metrics.backend_drift.labels(pool.name, backend.name).set(1 if backend.drift else 0)
        judge_context(runtime, pool)

    async def _learn_models(self, runtime: Runtime, pool: Pool, backend: Backend, timeout: float) -> None:
        """The models and adapters the backend serves now, asked every round: an adapter
        loaded or unloaded on a server is followed within one interval."""
        headers = _auth(pool.upstream_key)
        models = await _get_json(self._probes, pool.tls, backend.name + "/v1/models", headers, timeout)
        if backend in pool.members:
            learn_models(runtime, backend, models if isinstance(models, dict) else None)


def learn_models(runtime: Runtime, backend: Backend, models: dict[str, Any] | None) -> None:
    """Keep what the backend's `/v1/models` lists (no usable answer: what it listed last), and
    the runtime's index of learned adapters when that changed."""
    if models is None:
        return
    entries = served_entries(models)
    served = frozenset(entries)
    adapters = served_adapters(entries)
    if served == backend.served and adapters == backend.adapters:
        return
    backend.served = served
    if adapters != backend.adapters:
        backend.adapters = adapters
        reindex_adapters(runtime)


def reindex_adapters(runtime: Runtime) -> None:
    """The runtime's learned adapters, by name, with their parents (router/fleet/adapters.py)."""
    runtime.fleet.learned_adapters = learned_parents(
        (pool.config.model, (pool.config.model, *pool.config.aliases), b)
        for pool in runtime.pools.values()
        for b in pool.members
    )


def _auth(key: bytes | None) -> dict[str, str]:
    return {"authorization": "Bearer " + key.decode("latin-1")} if key else {}


async def live_facts(
    probes: ProbeClient, tls: UpstreamTls | None, origin: str, key: bytes | None, timeout: float
) -> tuple[str | None, dict[str, Any] | None]:
    """A server's `/version` and `/v1/models` (None for either it did not answer usably)."""
    headers = _auth(key)
    version = await _get_json(probes, tls, origin + "/version", headers, timeout)
    models = await _get_json(probes, tls, origin + "/v1/models", headers, timeout)
    live_version = version.get("version") if isinstance(version, dict) else None
    return (live_version if isinstance(live_version, str) else None), (
        models if isinstance(models, dict) else None
    )


async def _get_json(
    probes: ProbeClient, tls: UpstreamTls | None, url: str, headers: dict[str, str], timeout: float
) -> Any:
    answer = await probes.get(tls, url, cap=INFO_BYTES, timeout=timeout, headers=headers)
    if answer is None or answer.status != 200:
        return None
    try:
        return orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return None


async def reload_drift(cfg: ProfileConfig, current: Runtime | None, env: Mapping[str, str]) -> list[str]:
    """With `health.on_drift: refuse`, every difference between the new profile's pools and
    their live servers, asked now (a discovered pool's servers: those the current pool has, if
    any); a server that does not answer has nothing to compare."""
    if cfg.health.on_drift != "refuse":
        return []
    probes = ProbeClient()
    try:
        jobs = [
            _pool_drift(probes, name, pc, current, env, cfg.health.timeout_s)
            for name, pc in cfg.pools.items()
        ]
        found = await asyncio.gather(*jobs)
    finally:
        await probes.aclose()
    return [line for lines in found for line in lines]


async def _pool_drift(
    probes: ProbeClient,
    name: str,
    pc: PoolConfig,
    current: Runtime | None,
    env: Mapping[str, str],
    timeout: float,
) -> list[str]:
    try:
        tls = upstream_tls(pc, f"pools.{name}")
    except TlsFileError:
        return []  # the reload refuses the file for that itself
    key = (
        env.get(pc.upstream_api_key_env, pc.upstream_api_key)
        if pc.upstream_api_key_env
        else pc.upstream_api_key
    )
    origins = pc.origins
    if not origins and current is not None and name in current.pools:
        origins = tuple(b.name for b in current.pools[name].members)
    facts = await asyncio.gather(
        *(live_facts(probes, tls, o, key.encode("latin-1") if key else None, timeout) for o in origins)
    )
    return [
        drift_line(name, origin, drift)
        for origin, (version, models) in zip(origins, facts, strict=True)
        for drift in drift_of(pc, version, models)
    ]


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
