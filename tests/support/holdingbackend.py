"""A backend that holds every request before its first byte until the test lets it go, and
records how many it holds at every instant — the number a limit must bound — and from which
connections requests came.

A held request has reached the backend and is waiting for its response (prefilling, to the
router); once let go it is answered at once, and it stops counting just before the answer is
written, so the router can never see an answer of a request the backend still counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from router.app.asgi import Receive, Scope, Send, answer_lifespan, receive_body


@dataclass
class HoldingBackend:
    held: int = 0
    peak: int = 0
    served: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, held)
    connections: list[tuple[str, int]] = field(default_factory=list)  # each request's client
    arrivals: list[str] = field(default_factory=list)  # each request's x-request-id, in order
    _go: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._go.release()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                changed = self._changed
                await changed.wait()

    def _count(self, delta: int) -> None:
        self.held += delta
        self.peak = max(self.peak, self.held)
        self.timeline.append((time.monotonic(), self.held))
        self._changed.set()
        self._changed = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        await receive_body(receive)
        if scope["path"] != "/v1/chat/completions":
            await _json(send, 200, b"{}")
            return
        client = scope.get("client") or ("", 0)
        self.connections.append((str(client[0]), int(client[1])))
        ids = [v for k, v in scope["headers"] if k == b"x-request-id"]
        self.arrivals.append(ids[0].decode() if ids else "")
        self._count(+1)
        try:
            await self._go.acquire()
        finally:
            self._count(-1)
        self.served += 1
        await _json(send, 200, _ANSWER)


_ANSWER = orjson.dumps(
    {
        "id": "cmpl-held",
        "object": "chat.completion",
        "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)


async def _json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
