"""The app's `lifespan` scope: startup before the server listens, shutdown after it stopped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("lane_router.http")


class StartupFailed(Exception):
    """The app refused to start; the message is the app's."""


class Lifespan:
    __slots__ = ("_app", "_asked", "_started", "_stop", "_stopped", "_task")

    def __init__(self, app: Any) -> None:
        self._app = app
        self._asked = 0  # lifespan messages the app has received
        self._task: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._stop: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None

    async def startup(self) -> None:
        """Run the app's startup; raises StartupFailed when it reports a failure or raises."""
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        self._stop = loop.create_future()
        self._stopped = loop.create_future()
        self._task = loop.create_task(self._main(), name="lifespan")
        await self._started

    async def shutdown(self) -> None:
        task, stop, stopped = self._task, self._stop, self._stopped
        if task is None or stop is None or stopped is None:
            return
        self._task = None
        if not task.done():
            stop.set_result(None)
            await stopped
        await task

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self._app(scope, self._receive, self._send)
        except Exception as exc:
            if self._asked == 0:
                # An app without a lifespan raises on the unknown scope type: nothing to run.
                log.debug("the app has no lifespan: %r", exc)
            elif not _settle(self._started, StartupFailed(str(exc) or repr(exc))):
                log.exception("the app's lifespan failed")
        finally:
            _settle(self._started)
            _settle(self._stopped)

    async def _receive(self) -> dict[str, Any]:
        self._asked += 1
        if self._asked == 1:
            return {"type": "lifespan.startup"}
        assert self._stop is not None
        await self._stop
        return {"type": "lifespan.shutdown"}

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            _settle(self._started)
        elif kind == "lifespan.startup.failed":
            _settle(self._started, StartupFailed(message.get("message", "")))
        elif kind == "lifespan.shutdown.complete":
            _settle(self._stopped)
        elif kind == "lifespan.shutdown.failed":
            log.error("the app's shutdown failed: %s", message.get("message", ""))
            _settle(self._stopped)
        else:
            raise RuntimeError(f"unexpected lifespan message {kind!r}")


def _settle(future: asyncio.Future[None] | None, error: BaseException | None = None) -> bool:
    """Resolve `future` unless it already is; True if this call resolved it."""
    if future is None or future.done():
        return False
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
    return True
