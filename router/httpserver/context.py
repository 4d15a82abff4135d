"""What the connections of one server share: the app, the settings, and the two sets the server
stops with (open connections, requests whose app is still running)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from router.httpserver.config import ServerConfig
from router.httpserver.wire import DateHeader

if TYPE_CHECKING:
    from router.httpserver.connection import Connection
    from router.httpserver.exchange import Exchange


class ServerContext:
    __slots__ = (
        "_hurried",
        "_settled",
        "app",
        "closing",
        "config",
        "connections",
        "cutting",
        "date",
        "running",
        "scheme",
    )

    def __init__(self, app: Any, config: ServerConfig, scheme: str) -> None:
        self.app = app
        self.config = config
        self.scheme = scheme
        self.date = DateHeader()
        self.connections: set[Connection] = set()
        self.running: set[Exchange] = set()
        self.closing = False  # no new connections, none kept alive
        self.cutting = False  # the grace period is over: running apps are being cancelled
        self._hurried = False
        self._settled: asyncio.Future[None] | None = None

    def finished(self, ex: Exchange) -> None:
        """`ex`'s app has returned (or raised)."""
        running = self.running
        running.discard(ex)
        if not running and self._settled is not None:
            self._wake()

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections:
            self._wake()

    def hurry(self) -> None:
        self._hurried = True
        self._wake()

    def _wake(self) -> None:
        settled = self._settled
        if settled is not None and not settled.done():
            settled.set_result(None)

    async def settle(self, which: set[Any], timeout: float, hurried: bool = True) -> None:
        """Wait up to `timeout` for `which` (one of the two sets) to empty, or, if `hurried`,
        for `hurry`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while which and not (hurried and self._hurried):
                    self._settled = asyncio.get_running_loop().create_future()
                    try:
                        await self._settled
                    finally:
                        self._settled = None
