"""Several simulated vLLM servers on one event loop, one uvicorn server per port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

import uvicorn

from router.sim.config import EngineConfig
from router.sim.engine import Engine
from router.sim.runner import EngineRunner
from router.sim.server import ServerSettings, SimApp
from router.sim.timing import StepTimeModel


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One simulated server: where it listens, its engine, its timing, its HTTP settings."""

    port: int
    config: EngineConfig
    timing: StepTimeModel
    settings: ServerSettings = field(default_factory=ServerSettings)
    host: str = "127.0.0.1"


@dataclass(slots=True)
class _Running:
    spec: EngineSpec
    runner: EngineRunner
    server: uvicorn.Server
    sock: socket.socket

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    # proto=IPPROTO_TCP and TCP_NODELAY (inherited by accepted sockets): without them a small
    # SSE write waits for the client's delayed ACK, adding ~40 ms to every first token.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class SimCluster:
    """Starts every spec's server on the running loop; `stop()` aborts streams and closes all.
    Port 0 picks a free port; `urls` tells which."""

    def __init__(self, specs: Sequence[EngineSpec]) -> None:
        self.specs = list(specs)
        self._running: list[_Running] = []

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self._running]

    @property
    def engines(self) -> list[Engine]:
        return [r.runner.engine for r in self._running]

    async def start(self) -> None:
        try:
            for spec in self.specs:
                await self._start_one(spec)
        except BaseException:
            await self.stop()
            raise

    async def _start_one(self, spec: EngineSpec) -> None:
        runner = EngineRunner(Engine(spec.config, spec.timing))
        app = SimApp(runner, spec.settings)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=2,
        )
        config.load()
        server = uvicorn.Server(config)
        # startup() is driven directly (not serve()) so one process can run many servers under
        # one signal handler; serve() would set this attribute itself.
        server.lifespan = config.lifespan_class(config)
        sock = _bind(spec.host, spec.port)
        try:
            await server.startup(sockets=[sock])
        except BaseException:
            sock.close()
            raise
        runner.start()
        self._running.append(_Running(spec, runner, server, sock))

    async def stop(self) -> None:
        running, self._running = self._running, []
        for r in running:
            await r.runner.stop()  # ends every stream, so connections can close
        await asyncio.gather(*(_shutdown(r) for r in running))

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def _shutdown(r: _Running) -> None:
    try:
        r.server.should_exit = True
        await r.server.shutdown(sockets=[r.sock])
    finally:
        r.sock.close()
