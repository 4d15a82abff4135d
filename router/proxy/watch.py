"""Watching for a client that goes away while its request waits for or relays its response.

When it does, the request's task is cancelled at once, which closes the upstream connection
(vLLM then aborts the request and frees its KV blocks). The router's own server tells of the
loss itself (`BodyWriter.on_disconnect`, router/app/asgi.py): a request there is watched from its
start at the cost of one callback. Under another ASGI server, a task has to wait on `receive`
for `http.disconnect`, and most requests end before such a task would pay off, so one starts
only once a request has run a while (the profile's `slow_clients.watch_disconnect_after_s`),
which bounds how late a disconnect can be noticed. Those requests are kept in one `Watchlist`
per runtime, in the order they started, under a single timer set for the oldest: a request that
ends sooner costs an entry in a dict, not a timer of its own."""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

from router.app.asgi import BodyWriter, Receive

# A watch due this close is begun with those due now rather than under a timer of its own.
_EARLY_S: Final = 0.001


class Answerable(Protocol):
    # The last body message went out: the server reports a disconnect from then on (ASGI), and
    # that is the exchange ending, not the client leaving.
    answered: bool


class Watch:
    """One request's watch: `gone` once its client left before the response was answered."""

    __slots__ = ("_exchange", "_receive", "_task", "_watcher", "finished", "gone", "started")

    def __init__(
        self, task: asyncio.Task[None], exchange: Answerable, receive: Receive, started: float
    ) -> None:
        self._task = task
        self._exchange = exchange
        self._receive = receive
        self._watcher: asyncio.Task[None] | None = None
        self.started = started  # the loop's clock
        self.gone = False
        self.finished = False

    def begin(self) -> None:
        """The request has run its list's delay: listen for its client going away."""
        # The loop's own method: `asyncio.ensure_future` is interpreted.
        self._watcher = self._task.get_loop().create_task(_wait_disconnect(self._receive))
        self._watcher.add_done_callback(self._on_disconnect)

    def client_left(self) -> None:
        """The client went away: the request is cancelled, unless it has ended or been answered."""
        if not self.finished and not self._exchange.answered:
            self.gone = True
            self._task.cancel()

    def _on_disconnect(self, _: asyncio.Future[None]) -> None:
        self.client_left()

    def uncancel(self) -> None:
        """The cancellation was the watch's own: the request ends normally."""
        self._task.uncancel()

    def stop(self) -> None:
        self.finished = True
        watcher = self._watcher
        if watcher is not None:
            self._watcher = None
            watcher.remove_done_callback(self._on_disconnect)
            watcher.cancel()


class Watchlist:
    """The requests of one runtime not yet watched, oldest first, under one timer."""

    __slots__ = ("_after_s", "_loop", "_timer", "_waiting")

    def __init__(self, after_s: float) -> None:
        self._after_s = after_s
        self._waiting: dict[Watch, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, exchange: Answerable, receive: Receive, writer: BodyWriter | None = None) -> Watch:
        """A watch for the current task: told by `writer` when the server can tell (from now
        on), else begun the list's delay from now unless dropped first."""
        # The server names the request's task itself: asyncio's `current_task` is interpreted.
        task = None
        if writer is not None:
            task = writer.request_task()
            if task is not None:
                watch = Watch(task, exchange, receive, 0.0)
                if writer.on_disconnect(watch.client_left):
                    return watch
        # The task current on the list's loop is the caller's while that loop runs this thread:
        # asking for the running loop instead costs a system call (asyncio checks the pid).
        loop = self._loop
        if task is None and loop is not None:
            task = asyncio.current_task(loop)
        if task is None or loop is None:
            # A runtime used from a new loop (tests run several) starts its timer afresh.
            loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)
            assert task is not None
            self._loop, self._timer = loop, None
            self._waiting.clear()
        watch = Watch(task, exchange, receive, loop.time())
        self._waiting[watch] = None
        if self._timer is None:
            self._timer = loop.call_at(watch.started + self._after_s, self._due)
        return watch

    def drop(self, watch: Watch) -> None:
        """The request ended: stop its watch, or drop it from the list if it never began."""
        watch.stop()
        self._waiting.pop(watch, None)

    def _due(self) -> None:
        """Begin every watch that is due; set the timer for the next one."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time() + _EARLY_S
        waiting = self._waiting
        while waiting:
            watch = next(iter(waiting))
            due = watch.started + self._after_s
            if due > now:
                self._timer = loop.call_at(due, self._due)
                return
            del waiting[watch]
            watch.begin()

    def __len__(self) -> int:
        return len(self._waiting)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
