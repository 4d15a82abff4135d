"""ASGI apps the server tests run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.app.asgi import Receive, Scope, Send, answer_lifespan, send_json


async def read_all(receive: Receive) -> tuple[bytes, list[int]]:
    """The whole body and the size of each message it came in."""
    body = bytearray()
    sizes = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client gone")
        body += message.get("body", b"")
        sizes.append(len(message.get("body", b"")))
        if not message.get("more_body"):
            return bytes(body), sizes


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """The request as the app saw it, as JSON."""
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    body, _ = await read_all(receive)
    seen = {k: v for k, v in scope.items() if k not in ("headers", "raw_path", "query_string", "extensions")}
    seen.update(
        raw_path=scope["raw_path"].decode("latin-1"),
        query_string=scope["query_string"].decode("latin-1"),
        headers=[[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
        body=body.decode("latin-1"),
    )
    await send_json(send, 200, seen)


@dataclass
class Scripted:
    """An app whose requests each run a coroutine the test chooses by path (`echo` for other
    paths), and that records what happened; the test waits on `changed` instead of sleeping."""

    handlers: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self, what: str, detail: Any = None) -> None:
        self.events.append((what, detail))
        self.changed.set()

    async def wait_for(self, what: str, timeout: float = 10.0) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                for name, detail in self.events:
                    if name == what:
                        return detail
                self.changed.clear()
                await self.changed.wait()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        handler = self.handlers.get(scope["path"])
        if handler is None:
            await echo(scope, receive, send)
        else:
            await handler(self, scope, receive, send)


def sse_start() -> dict[str, Any]:
    return {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/event-stream")],
    }


def event(i: int) -> dict[str, Any]:
    return {
        "type": "http.response.body",
        "body": b"data: " + orjson.dumps({"i": i}) + b"\n\n",
        "more_body": True,
    }
