"""Several simulated vLLM servers on one event loop, one uvicorn server per port.

With `note_deliveries`, each server notes when it began and finished sending each response, by
the `X-Request-Id` it received, so an experiment can tell when the backend was done with a
request apart from when its client was. The router forwards `<key name>:<id>`; the note is kept
under the client's own id.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

import uvicorn

from router.app.asgi import Message, Receive, Scope, Send
from router.lab.sim.config import EngineConfig
from router.lab.sim.engine import Engine
from router.lab.sim.kv_publisher import KVEventsConfig, ZmqKVEventPublisher
from router.lab.sim.runner import EngineRunner
from router.lab.sim.server import ServerSettings, SimApp
from router.lab.sim.timing import StepTimeModel


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One simulated server: where it listens, its engine, its timing, its HTTP settings."""

    port: int
    config: EngineConfig
    timing: StepTimeModel
    settings: ServerSettings = field(default_factory=ServerSettings)
    host: str = "127.0.0.1"
    kv_events: KVEventsConfig | None = None  # `--kv-events-config`, this server's endpoints


@dataclass(frozen=True, slots=True)
class Delivery:
    started: float  # time.monotonic() when the request reached the server
    finished: float | None  # when the last byte of its response was sent; None until then


class DeliveryLog:
    """Wraps a simulated server's app: request id → its `Delivery`."""

    def __init__(self, app: SimApp) -> None:
        self.app = app
        self.deliveries: dict[str, Delivery] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = next((v.decode() for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)
        if scope["type"] != "http" or rid is None:
            await self.app(scope, receive, send)
            return
        rid = rid.rpartition(":")[2]
        started = time.monotonic()
        self.deliveries[rid] = Delivery(started, None)

        async def noting(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.deliveries[rid] = Delivery(started, time.monotonic())

        await self.app(scope, receive, noting)


@dataclass(slots=True)
class _Running:
    spec: EngineSpec
    runner: EngineRunner
    server: uvicorn.Server
    sock: socket.socket
    log: DeliveryLog | None

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

    def __init__(self, specs: Sequence[EngineSpec], *, note_deliveries: bool = False) -> None:
        self.specs = list(specs)
        self._note = note_deliveries
        self._running: list[_Running] = []

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self._running]

    @property
    def engines(self) -> list[Engine]:
        return [r.runner.engine for r in self._running]

    def deliveries(self, index: int) -> dict[str, Delivery]:
        """What server `index` delivered (empty unless the cluster notes deliveries)."""
        log = self._running[index].log
        return log.deliveries if log is not None else {}

    def delivery(self, request_id: str) -> Delivery | None:
        """When any server of the cluster received and answered `request_id`."""
        for i in range(len(self._running)):
            found = self.deliveries(i).get(request_id)
            if found is not None:
                return found
        return None

    async def start(self) -> None:
        try:
            for spec in self.specs:
                await self._start_one(spec)
        except BaseException:
            await self.stop()
            raise

    async def _start_one(self, spec: EngineSpec) -> None:
        publishes = spec.kv_events is not None and spec.kv_events.publishes
        publisher = ZmqKVEventPublisher(spec.kv_events) if spec.kv_events is not None and publishes else None
        runner = EngineRunner(Engine(spec.config, spec.timing, kv_events=publishes), publisher)
        try:
            await self._serve_one(spec, runner)
        except BaseException:
            if publisher is not None:
                publisher.close()
            raise

    async def _serve_one(self, spec: EngineSpec, runner: EngineRunner) -> None:
        app = SimApp(runner, spec.settings)
        log = DeliveryLog(app) if self._note else None
        config = uvicorn.Config(
            log or app,
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
        self._running.append(_Running(spec=spec, runner=runner, server=server, sock=sock, log=log))

    async def stop(self) -> None:
        running, self._running = self._running, []
        for r in running:
            await r.runner.stop()  # ends every stream, so connections can close
        try:
            await asyncio.gather(*(_shutdown(r) for r in running))
        finally:
            for r in running:
                if r.runner.kv_publisher is not None:
                    r.runner.kv_publisher.close()

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
