"""The server: the listener, its connections, and the graceful stop.

Stopping closes the listener and every idle connection, lets requests in progress finish until
the grace deadline, then cancels the apps still running; each unfinished response is ended
(see router/httpserver/exchange.py `Exchange.cut`) and the app's lifespan shutdown runs last."""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
from typing import Any

from router.httpserver.config import ServerConfig
from router.httpserver.connection import Connection
from router.httpserver.context import ServerContext
from router.httpserver.lifespan import Lifespan
from router.httpserver.tls import TlsListener, TlsTermination, listening_socket

# After the cancellation at the grace deadline: how long the apps get to unwind, and how long
# the connections get to deliver their last bytes before they are reset.
UNWIND_S = 5.0
FLUSH_S = 2.0


class HttpServer:
    """`ssl`: serve TLS (router/httpserver/tls.py) with this context, or with the one a
    `TlsTermination` holds when each connection arrives."""

    __slots__ = ("_ctx", "_lifespan", "_listener", "_port", "_tls", "config")

    def __init__(
        self,
        app: Any,
        config: ServerConfig | None = None,
        *,
        ssl: ssl_module.SSLContext | TlsTermination | None = None,
    ) -> None:
        self.config = config or ServerConfig()
        self._tls = TlsTermination(ssl) if isinstance(ssl, ssl_module.SSLContext) else ssl
        self._ctx = ServerContext(app, self.config, "https" if ssl is not None else "http")
        self._lifespan = Lifespan(app)
        self._listener: asyncio.Server | TlsListener | None = None
        self._port = 0

    async def start(
        self, host: str | None = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None
    ) -> None:
        """Run the app's startup, then listen on `host`:`port`, or on `sock`, a socket already
        bound (and possibly shared with other processes)."""
        await self._lifespan.startup()
        loop = asyncio.get_running_loop()
        ctx = self._ctx
        backlog = self.config.backlog
        factory = lambda: Connection(ctx, loop)  # noqa: E731
        try:
            if self._tls is not None:
                sockets = (sock if sock is not None else listening_socket(host, port, backlog),)
                self._listener = TlsListener(
                    tls=self._tls, ctx=ctx, loop=loop, make_connection=factory, sockets=sockets
                )
            elif sock is not None:
                self._listener = await loop.create_server(factory, sock=sock, backlog=backlog)
            else:
                self._listener = await loop.create_server(
                    factory, host, port, reuse_address=True, backlog=backlog
                )
        except BaseException:
            await self._lifespan.shutdown()
            raise
        self._port = self.sockets[0].getsockname()[1]

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._listener.sockets) if self._listener is not None else ()

    @property
    def port(self) -> int:
        """The port listened on (the first socket's)."""
        return self._port

    @property
    def open_connections(self) -> int:
        return len(self._ctx.connections)

    @property
    def running_requests(self) -> int:
        return len(self._ctx.running)

    def hurry(self) -> None:
        """End the grace period of a stop in progress now."""
        self._ctx.hurry()

    async def shutdown(self, grace_s: float | None = None) -> None:
        ctx = self._ctx
        if ctx.closing:
            return
        ctx.closing = True
        if self._listener is not None:
            self._listener.close()
        try:
            for conn in list(ctx.connections):
                conn.shutdown()
            grace = self.config.graceful_shutdown_s if grace_s is None else grace_s
            await ctx.settle(ctx.running, grace)
            if ctx.running:
                ctx.cutting = True
                for ex in list(ctx.running):
                    if ex.task is not None:
                        ex.task.cancel()
                # A hurried stop still lets the cancelled apps end their responses and the
                # connections deliver those ends (bounded): hurry skips the grace, not the framing.
                await ctx.settle(ctx.running, UNWIND_S, hurried=False)
            await ctx.settle(ctx.connections, FLUSH_S, hurried=False)
            for conn in list(ctx.connections):
                conn.abort()
            if self._listener is not None:
                await self._listener.wait_closed()
        finally:
            await self._lifespan.shutdown()
