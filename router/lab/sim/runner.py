"""Drives an Engine in real time on an asyncio loop and hands tokens to per-request streams.

The loop runs steps back to back: schedule (engine.step), sleep for the step's modelled
duration, then hand the step's tokens to the API server's loop (`Frontend`), which passes them
to the clients when its queue reaches them; the next step does not wait for that, as vLLM's
engine core does not wait for its API server. Steps follow the model's timeline; when the
process falls behind by more than `_MAX_LAG` (overload), the timeline is reset to the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

from router.lab.sim.engine import Engine, StepResult
from router.lab.sim.frontend import Frontend
from router.lab.sim.kv_events import encode_batch
from router.lab.sim.kv_publisher import ZmqKVEventPublisher
from router.lab.sim.request import EngineRequest

_MAX_LAG = 0.02


class TokenStream:
    """What a client handler reads: tokens delivered so far and whether the request ended."""

    __slots__ = ("_interval", "_notified", "_waiter", "delivered", "done", "request")

    def __init__(self, request: EngineRequest, interval: int) -> None:
        self.request = request
        self.delivered = 0
        self.done = False
        self._interval = interval
        self._notified = 0
        self._waiter: asyncio.Future[None] | None = None

    def _deliver(self, finished: bool) -> None:
        self.delivered += 1
        self.done = finished
        # The first token goes out at once, then every `stream_interval` tokens, and the last.
        if finished or self._notified == 0 or self.delivered - self._notified >= self._interval:
            self._wake()

    def _end(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self._notified = self.delivered
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, sent: int) -> None:
        """Return once more than `sent` tokens can be sent or the request ended."""
        while not self.done and self._notified <= sent:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class EngineRunner:
    def __init__(self, engine: Engine, kv_publisher: ZmqKVEventPublisher | None = None) -> None:
        self.engine = engine
        self.kv_publisher = kv_publisher
        self.frontend = Frontend(engine.timing)
        self.streams: dict[str, TokenStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timeline = 0.0
        self._handing: deque[StepResult] = deque()  # steps whose tokens the frontend still holds

    @property
    def in_flight(self) -> int:
        return len(self.streams)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for rid in list(self.streams):
            self.abort(rid)

    async def admit(self, prompt_tokens: int) -> None:
        """Wait while the API server admits a request of this length (its queue, then its work)."""
        loop = asyncio.get_running_loop()
        delay = self.frontend.admit(loop.time(), prompt_tokens) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    def submit(self, request: EngineRequest) -> TokenStream:
        """Queue a request now; raises Unavailable when the engine's queue is full."""
        now = asyncio.get_running_loop().time()
        self.engine.add_request(request, now)
        stream = TokenStream(request, self.engine.config.stream_interval)
        request.handle = stream
        self.streams[request.request_id] = stream
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        stream = self.streams.pop(request_id, None)
        self.engine.abort(request_id, asyncio.get_running_loop().time())
        if stream is not None:
            stream._end()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        idle = True
        while True:
            if not engine.has_work:
                idle = await self._idle()
                continue
            now = loop.time()
            # Back-to-back steps keep the model's timeline; after idling it restarts at now.
            start = self._timeline if not idle and self._timeline >= now - _MAX_LAG else now
            result = engine.step(start)
            if result is None:
                idle = await self._idle()
                continue
            idle = False
            self._publish_kv_events()
            self._timeline = result.end
            delay = result.end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            handed = self.frontend.emit(result.end, len(result.outputs))
            if self._handing or handed > loop.time():
                self._handing.append(result)
                loop.call_at(handed, self._hand_over)
            else:
                self._deliver(result)

    def _publish_kv_events(self) -> None:
        # One batch per step that changed the cache, stamped with wall time, as vLLM's scheduler.
        log, publisher = self.engine.kv_events, self.kv_publisher
        if log is None or publisher is None:
            return
        events = log.take()
        if events:
            publisher.publish(encode_batch(time.time(), events))

    async def _idle(self) -> bool:
        self._wake.clear()
        await self._wake.wait()
        return True

    def _hand_over(self) -> None:
        # One call per queued step, oldest first: timers due at the same moment may run in any
        # order, the steps' tokens may not.
        self._deliver(self._handing.popleft())

    def _deliver(self, result: StepResult) -> None:
        # Whether this step finished a request, not whether it has finished by now: the engine
        # may be steps ahead of the tokens the frontend hands over.
        ended = set(result.finished)
        for req in result.outputs:
            stream: TokenStream = req.handle
            if not stream.done:  # aborted while the step ran
                stream._deliver(req in ended)
        streams = self.streams
        for req in result.finished:
            streams.pop(req.request_id, None)
