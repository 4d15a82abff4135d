"""Running the router: uvicorn (uvloop + httptools) around `LaneRouterApp`, plus the background
work of a live router — health probes, the profile-file watcher and SIGHUP reload."""

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

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.app import LaneRouterApp
from router.config.load import load_profile
from router.config.models import ProfileConfig
from router.health import HealthChecker
from router.metrics import Metrics
from router.runtime import build_runtime
from router.scrape import LoadScraper
from router.settings import Settings
from router.state import RouterState

log = logging.getLogger("lane_router.server")


class NoDelayHttpToolsProtocol(HttpToolsProtocol):
    """Without TCP_NODELAY the first small SSE write of a stream can wait for the client's
    delayed ACK, adding tens of milliseconds to time-to-first-token."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)


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
                await self._state.reload("file change")


def build_state(cfg: ProfileConfig, config_path: Path | None) -> RouterState:
    metrics = Metrics()
    return RouterState(build_runtime(cfg, metrics), metrics, config_path)


@contextlib.asynccontextmanager
async def background(state: RouterState, settings: Settings) -> AsyncIterator[None]:
    checker = HealthChecker(lambda: state.runtime, state.metrics)
    checker.start()
    scraper = LoadScraper(lambda: state.runtime)
    scraper.start()
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()

    def on_sighup() -> None:
        tasks.append(loop.create_task(_reload_and_probe(state, checker, "SIGHUP")))

    if state.config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
        if settings.watch_config:
            watcher = ConfigWatcher(state, state.config_path, settings.watch_interval_s)
            tasks.append(loop.create_task(watcher.run(), name="lane-router-config-watch"))
    try:
        yield
    finally:
        if state.config_path is not None:
            loop.remove_signal_handler(signal.SIGHUP)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await scraper.stop()
        await checker.stop()
        await state.aclose()


async def _reload_and_probe(state: RouterState, checker: HealthChecker, trigger: str) -> None:
    outcome = await state.reload(trigger)
    if outcome.ok:
        checker.poke()


def make_app(state: RouterState, settings: Settings) -> LaneRouterApp:
    return LaneRouterApp(state, lifespan=lambda: background(state, settings))


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": NoDelayHttpToolsProtocol,
        "lifespan": "on",
        "access_log": settings.access_log,
        "log_level": settings.log_level,
        "server_header": False,
        # The router is the edge; it does not trust X-Forwarded-* from clients (and skips a layer).
        "proxy_headers": False,
        "timeout_graceful_shutdown": settings.graceful_shutdown_s,
        "backlog": 4096,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def serve(settings: Settings, cfg: ProfileConfig | None = None) -> None:
    path = settings.config
    if cfg is None:
        if path is None:
            raise ValueError("no profile: pass --config FILE or set LANE_ROUTER_CONFIG")
        cfg = load_profile(path)
    state = build_state(cfg, path)
    server = uvicorn.Server(uvicorn_config(make_app(state, settings), settings))
    server.run()
