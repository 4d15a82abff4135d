"""Real servers on loopback for tests, in the test's event loop: the router on its own HTTP
server (router/httpserver/), fake backends on uvicorn or on the same server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from router.httpserver import HttpServer, ServerConfig
from router.lab.procs import free_ports
from router.server import make_app, server_config
from router.settings import Settings
from router.state.live import RouterState

# Shutdown grace of test servers: a test that ends with a stream open does not wait long.
GRACE_S = 2.0


def free_port() -> int:
    return free_ports(1)[0]


class ServerGroup:
    """Servers started one by one and stopped together (each stop waits out its own shutdown
    grace, so stopping them in parallel keeps tests fast)."""

    def __init__(self) -> None:
        self._uvicorns: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []
        self._servers: list[HttpServer] = []

    async def serve(self, app: Any, config: ServerConfig | None = None, port: int = 0) -> str:
        """Run `app` on the router's HTTP server; its base URL."""
        server = HttpServer(app, config or ServerConfig(graceful_shutdown_s=GRACE_S))
        await server.start("127.0.0.1", port)
        self._servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    async def serve_router(self, state: RouterState, settings: Settings | None = None, **server: Any) -> str:
        """The router on `state`, its server configured as `lane-router serve` configures it
        (`server`: overrides of router/httpserver/config.py `ServerConfig`)."""
        settings = settings or Settings()
        config = server_config(settings, **{"graceful_shutdown_s": GRACE_S, **server})
        return await self.serve(make_app(state, settings), config)

    async def start(self, app: Any, port: int | None = None, **config: Any) -> str:
        """Run `app` on uvicorn (`config`: uvicorn's options); its base URL."""
        port = port or free_port()
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "warning",
            "lifespan": "on",
            "access_log": False,
            "timeout_graceful_shutdown": GRACE_S,
        }
        options.update(config)
        server = uvicorn.Server(uvicorn.Config(app, **options))
        task = asyncio.create_task(server.serve())
        self._uvicorns.append((server, task))
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("server exited before it started")
                await asyncio.sleep(0.005)
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        for server, _ in self._uvicorns:
            server.should_exit = True
        stops = [s.shutdown() for s in self._servers]
        await asyncio.wait_for(asyncio.gather(*stops, *(t for _, t in self._uvicorns)), 15)
        self._uvicorns.clear()
        self._servers.clear()


@contextlib.asynccontextmanager
async def server_group() -> AsyncIterator[ServerGroup]:
    group = ServerGroup()
    try:
        yield group
    finally:
        await group.stop()


@contextlib.asynccontextmanager
async def running(app: Any, port: int | None = None, **config: Any) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 (uvicorn) until the block ends; yields its base URL."""
    async with server_group() as group:
        yield await group.start(app, port, **config)
