"""Real uvicorn servers on loopback for tests: the router and fake backends, in the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerGroup:
    """Servers started one by one and stopped together (each stop waits out uvicorn's own
    shutdown grace, so stopping them in parallel keeps tests fast)."""

    def __init__(self) -> None:
        self._servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(self, app: Any, port: int | None = None, **config: Any) -> str:
        port = port or free_port()
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "warning",
            "lifespan": "on",
            "access_log": False,
            "timeout_graceful_shutdown": 2,
        }
        options.update(config)
        server = uvicorn.Server(uvicorn.Config(app, **options))
        task = asyncio.create_task(server.serve())
        self._servers.append((server, task))
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("server exited before it started")
                await asyncio.sleep(0.005)
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        for server, _ in self._servers:
            server.should_exit = True
        await asyncio.wait_for(asyncio.gather(*(t for _, t in self._servers)), 15)
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
    """Serve `app` on 127.0.0.1 until the block ends; yields its base URL."""
    async with server_group() as group:
        yield await group.start(app, port, **config)
