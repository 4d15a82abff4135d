"""A measured stack: simulated vLLM servers in this process, the router in its own process.

Each simulated server's app is wrapped to note when it finished sending each response (by the
`X-Request-Id` the router forwards), so an experiment can tell when the backend was done with a
request, apart from when its client was.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
import yaml

from router.asgi import Message, Receive, Scope, Send
from router.bench.stack import wait_ready
from router.proxy.upstream import UpstreamPool
from router.sim.config import EngineConfig
from router.sim.engine import Engine
from router.sim.runner import EngineRunner
from router.sim.server import ServerSettings, SimApp
from router.sim.timing import StepTimeModel

LAB_KEY = "lanelab-key"


class Recorder:
    """Wraps a simulated server: request id → when its response's last byte was sent."""

    def __init__(self, app: SimApp) -> None:
        self.app = app
        self.finished: dict[str, float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v.decode() for k, v in scope["headers"] if k == b"x-request-id"), None)

        async def noting(message: Message) -> None:
            await send(message)
            if rid and message["type"] == "http.response.body" and not message.get("more_body"):
                self.finished[rid] = time.monotonic()

        await self.app(scope, receive, noting)


@dataclass
class SimServer:
    url: str
    engine: Engine
    recorder: Recorder
    server: uvicorn.Server
    runner: EngineRunner


@dataclass
class Sims:
    servers: list[SimServer] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def finished(self, request_id: str) -> float | None:
        for s in self.servers:
            if request_id in s.recorder.finished:
                return s.recorder.finished[request_id]
        return None


def _listen() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def simulated(configs: list[EngineConfig], timing: StepTimeModel, model: str) -> AsyncIterator[Sims]:
    sims = Sims()
    sockets: list[socket.socket] = []
    try:
        for config in configs:
            runner = EngineRunner(Engine(config, timing))
            recorder = Recorder(SimApp(runner, ServerSettings(served_model_names=(model,))))
            cfg = uvicorn.Config(recorder, lifespan="off", log_level="warning", access_log=False)
            cfg.load()
            server = uvicorn.Server(cfg)
            server.lifespan = cfg.lifespan_class(cfg)
            sock = _listen()
            sockets.append(sock)
            await server.startup(sockets=[sock])
            runner.start()
            port = sock.getsockname()[1]
            sims.servers.append(
                SimServer(f"http://127.0.0.1:{port}", runner.engine, recorder, server, runner)
            )
        yield sims
    finally:
        for s in sims.servers:
            await s.runner.stop()
        for s in sims.servers:
            s.server.should_exit = True
            await s.server.shutdown(sockets=[])
        for sock in sockets:
            sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _write_profile(directory: str, profile: Mapping[str, Any]) -> Path:
    path = Path(directory, "profile.yaml")
    # The engines are simulated: the router counts prompt tokens as they do.
    path.write_text(yaml.safe_dump({"tokenizer": "simulator", **profile}))
    return path


@contextlib.asynccontextmanager
async def router_process(profile: Mapping[str, Any]) -> AsyncIterator[str]:
    """`lane-router serve` on a free port with `profile`; yields its URL."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        path = _write_profile(tmp, profile)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "router",
            "serve",
            "--config",
            str(path),
            "--port",
            str(port),
            "--log-level",
            "warning",
            stdout=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url, {}, 30.0)
            yield url
        finally:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@dataclass(frozen=True, slots=True)
class CacheCounters:
    hits: float
    queries: float

    def rate_since(self, before: CacheCounters) -> float:
        queries = self.queries - before.queries
        return (self.hits - before.hits) / queries if queries else 0.0


async def prefix_cache(urls: list[str]) -> CacheCounters:
    """Σ vllm:prefix_cache_hits / queries over the backends' own /metrics."""
    hits = queries = 0.0
    for url in urls:
        pool = UpstreamPool(url)
        try:
            resp = await pool.request(b"GET", b"/metrics", [], b"")
            text = (await resp.read()).decode()
        finally:
            await pool.aclose()
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return CacheCounters(hits, queries)
