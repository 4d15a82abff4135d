"""Serving as the process's main job: until SIGINT or SIGTERM, then a graceful stop (a second
signal ends its grace period at once)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import ssl as ssl_module
from typing import Any

from router.httpserver.config import ServerConfig
from router.httpserver.server import HttpServer
from router.httpserver.tls import TlsTermination

log = logging.getLogger("lane_router.http")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def serve(
    app: Any,
    config: ServerConfig,
    *,
    host: str | None = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    ssl: ssl_module.SSLContext | TlsTermination | None = None,
) -> None:
    server = HttpServer(app, config, ssl=ssl)
    await server.start(host, port, sock=sock)
    # What start-up built (modules, settings, the runtime) lives as long as the process: frozen,
    # it is left out of the collections that each request's allocations trigger, which would
    # otherwise walk all of it again and again.
    gc.collect()
    gc.freeze()
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if stop.done():
            server.hurry()
        else:
            stop.set_result(None)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    scheme = "https" if ssl is not None else "http"
    for s in server.sockets:
        name = s.getsockname()
        log.info("serving on %s://%s:%s", scheme, name[0], name[1])
    try:
        await stop
        log.info("stopping: %d request(s) in progress", server.running_requests)
        await server.shutdown()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
