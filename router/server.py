"""Running the router: `LaneRouterApp` on the router's own HTTP server (router/httpserver/) under
uvloop, plus the background work of a live router — health probes, the pools' DNS discovery,
load scrapes, the engines' KV event streams, the profile-file watcher and SIGHUP reload (of the
profile and the TLS files), all started and stopped here. With `--workers N` this process supervises N workers
(router/supervisor/workers.py), each of which runs here with its worker side
(router/supervisor/workerlink.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvloop

from router import BUILD, httpserver
from router.app.app import LaneRouterApp
from router.config.checks import budget_warnings
from router.config.load import load_profile
from router.config.models import ProfileConfig
from router.errors import Unavailable, error_event
from router.fleet.discovery import Discovery
from router.fleet.health import HealthChecker, reload_drift
from router.fleet.kvfollow import KVFollower
from router.fleet.scrape import LoadScraper
from router.observe.metrics import Metrics
from router.observe.observer import Observer, build_observer
from router.proxy.respond import ResponseAborted
from router.settings import Settings
from router.state.counters import counting_lines
from router.state.live import RouterState
from router.state.runtime import Runtime, build_runtime
from router.supervisor.workerlink import FILE_TRIGGER, SIGHUP_TRIGGER, WorkerSide, WorkerState
from router.supervisor.workermetrics import MetricsApp
from router.supervisor.workers import bind, supervise
from router.tls.contexts import TlsFileError
from router.tls.serving import ServingTls

log = logging.getLogger("lane_router.server")


class DriftRefused(Exception):
    """The profile refuses drift (`health.on_drift: refuse`) and a live server differs from it."""


class ConfigWatcher:
    """Polls the profile file's identity (inode, size, mtime). Polling the path, not the open
    file, sees an atomic replace (write elsewhere, rename over) as well as an edit in place."""

    def __init__(self, state: RouterState, path: Path, interval_s: float) -> None:
        self._state = state
        self._path = path
        self._interval = interval_s
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            stamp = self._stamp()
            if stamp is not None and stamp != self._seen:
                self._seen = stamp
                await self._state.reload(FILE_TRIGGER)


def build_state(
    cfg: ProfileConfig,
    config_path: Path | None,
    bind_host: str = "127.0.0.1",
    observer: Observer | None = None,
    tls: ServingTls | None = None,
) -> RouterState:
    metrics = Metrics()
    runtime = build_runtime(cfg, metrics, observer=observer)
    return RouterState(runtime, metrics, config_path, bind_host=bind_host, tls=tls)


@contextlib.asynccontextmanager
async def background(
    state: RouterState, settings: Settings, worker: WorkerSide | None = None
) -> AsyncIterator[None]:
    if worker is not None:
        await worker.start(state.reload_files)
    if state.tls is not None:
        state.tls.attach(state.metrics)
    checker = HealthChecker(lambda: state.runtime, state.metrics)
    # One round before listening: drift is reported (or refuses the start) before any request.
    try:
        refused = await checker.first_round()
    except BaseException:
        await checker.stop()
        raise
    if refused is not None:
        await checker.stop()
        raise DriftRefused(refused)
    checker.start()
    # A backend discovery finds is probed at once, and joins the rotation once healthy.
    discovery = Discovery(lambda: state.runtime, state.metrics, checker.probe_joined)
    discovery.start()
    scraper = LoadScraper(lambda: state.runtime)
    scraper.start()
    kv_events = KVFollower(lambda: state.runtime, state.metrics)  # for precise_prefix lanes
    kv_events.start()
    slots = state.runtime.counting.store
    if slots is not None:
        slots.start()  # an idle process learns what the others hold, and is known to them
    tasks: set[asyncio.Task[Any]] = set()
    loop = asyncio.get_running_loop()

    def keep(task: asyncio.Task[Any]) -> None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def on_sighup() -> None:
        # The checker follows the runtime a reload swaps in: it probes the new one at once.
        keep(loop.create_task(state.reload_files(SIGHUP_TRIGGER)))

    hangup = state.config_path is not None or state.tls is not None
    if hangup:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    if state.config_path is not None and settings.watch_config:
        watcher = ConfigWatcher(state, state.config_path, settings.watch_interval_s)
        keep(loop.create_task(watcher.run(), name="lane-router-config-watch"))
    try:
        yield
    finally:
        if hangup:
            loop.remove_signal_handler(signal.SIGHUP)
        running = list(tasks)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await scraper.stop()
        await kv_events.stop()
        await discovery.stop()  # before the checker, whose first probes it starts
        await checker.stop()
        await state.aclose()
        state.runtime.observer.close()
        if worker is not None:
            await worker.stop()


def make_app(state: RouterState, settings: Settings) -> LaneRouterApp:
    return LaneRouterApp(state, lifespan=lambda: background(state, settings))


def server_config(settings: Settings, **overrides: Any) -> httpserver.ServerConfig:
    """The HTTP server's settings for the router: its limits from `settings`, the event that ends
    a stream cut at shutdown, and `ResponseAborted` (which the app logs itself) as quiet."""
    options: dict[str, Any] = {
        "max_head_bytes": settings.max_head_bytes,
        "max_headers": settings.max_headers,
        "head_timeout_s": settings.head_timeout_s,
        "keepalive_timeout_s": settings.keepalive_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "max_connections": settings.max_connections,
        "graceful_shutdown_s": settings.graceful_shutdown_s,
        "access_log": settings.access_log,
        "shutdown_event": error_event(Unavailable("the router is shutting down", code="server_shutdown")),
        "quiet_errors": (ResponseAborted,),
    }
    options.update(overrides)
    return httpserver.ServerConfig(**options)


def serve(settings: Settings, cfg: ProfileConfig | None = None) -> int:
    """`lane-router serve`: the app for `cfg` (else the profile file of `settings`), served until
    SIGINT or SIGTERM — by this process, or by `settings.workers` workers it supervises. With
    TLS settings the files are checked first; each worker loads (and reloads) them itself."""
    if not settings.is_worker:
        # Compiled modules bypassed cost CPU per request (docs/compiled.md): an operator should see it.
        report = log.warning if BUILD.mode == "sources" else log.info
        report("request path %s", BUILD.describe())
    tls = serving_tls(settings)
    if settings.workers > 1 and not settings.is_worker:
        if settings.config is None:
            raise ValueError("--workers needs a profile file (--config FILE or LANE_ROUTER_CONFIG)")
        cfg = cfg if cfg is not None else load_profile(settings.config)
        warn_of_parts(cfg, settings.workers)
        refuse_drift(cfg)
        try:
            return supervise(settings)
        except OSError as err:
            raise SystemExit(
                f"lane-router serve: cannot serve on {settings.host}:{settings.port}: {err}"
            ) from None
    run(build_app(settings, cfg, tls), settings, tls)
    return 0


def serving_tls(settings: Settings) -> ServingTls | None:
    try:
        tls = ServingTls.of(settings)
    except TlsFileError as err:
        raise SystemExit(f"lane-router serve: cannot serve TLS: {err}") from None
    if tls is not None:
        log.info("serving %s", tls.describe())
    return tls


def refuse_drift(cfg: ProfileConfig) -> None:
    """Under a supervisor, `health.on_drift: refuse` is judged once, before any worker starts
    (each worker's own first round would only be restarted)."""
    drift = asyncio.run(reload_drift(cfg, None, os.environ))
    if drift:
        raise SystemExit(
            "lane-router serve: refusing to start: the live servers differ from the profile "
            "(health.on_drift: refuse): " + "; ".join(drift)
        )


def warn_of_parts(cfg: ProfileConfig, workers: int) -> None:
    """Log, once as the workers start, what `lane-router check --workers N` warns of: a worker
    whose part of a limit is 0, and rate limits each worker counts alone without `state:`."""
    for issue in budget_warnings(cfg, workers):
        log.warning("%s", issue)


def log_counting(runtime: Runtime) -> None:
    """How each model's prompts are counted, once at the start."""
    for line in counting_lines(runtime.tokenizers):
        log.info("prompts of %s", line.strip())


def build_app(settings: Settings, cfg: ProfileConfig | None = None, tls: ServingTls | None = None) -> Any:
    path = settings.config
    if cfg is None:
        if path is None:
            raise ValueError("no profile: pass --config FILE or set LANE_ROUTER_CONFIG")
        cfg = load_profile(path)
    if not settings.is_worker:
        state = build_state(cfg, path, settings.host, build_observer(settings), tls)
        log_counting(state.runtime)
        return make_app(state, settings)
    worker = WorkerSide.of(settings)
    runtime = build_runtime(cfg, worker.metrics, worker=worker.share, observer=build_observer(settings))
    host, link, index = settings.host, worker.link, worker.share.index
    if index == 0:
        log_counting(runtime)
    state = WorkerState(runtime, worker.metrics, path, bind_host=host, link=link, worker=index, tls=tls)
    app = LaneRouterApp(state, lifespan=lambda: background(state, settings, worker))
    return MetricsApp(app, worker.peers)


def run(app: Any, settings: Settings, tls: ServingTls | None = None) -> None:
    """Serve `app` on the router's HTTP server under uvloop until a signal stops it."""
    termination = tls.termination if tls is not None else None
    try:
        sock = _worker_socket(settings)
        config = server_config(settings)
        uvloop.run(
            httpserver.serve(app, config, host=settings.host, port=settings.port, sock=sock, ssl=termination)
        )
    except httpserver.StartupFailed as err:
        raise SystemExit(f"lane-router serve: startup failed: {err}") from None
    except OSError as err:
        raise SystemExit(
            f"lane-router serve: cannot serve on {settings.host}:{settings.port}: {err}"
        ) from None


def _worker_socket(settings: Settings) -> socket.socket | None:
    """A worker's socket on the shared port: its own (SO_REUSEPORT) or the parent's; None for a
    router serving alone, which binds its own as it starts."""
    if not settings.is_worker:
        return None
    if settings.listen_fd is not None:
        return socket.socket(fileno=settings.listen_fd)
    return bind(settings.host, settings.port, reuse_port=True)
