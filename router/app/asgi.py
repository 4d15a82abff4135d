"""ASGI types and the few response helpers every edge module shares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final

import orjson
from mypy_extensions import mypyc_attr

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# A server extension of the router's own HTTP server (router/httpserver/): `scope["extensions"]`
# maps this name to a `BodyWriter` for the request. A relay that holds one writes body parts
# from an upstream read callback instead of waking its task for every chunk, and a body it has
# whole together with the response's start.
BODY_WRITER: Final = "lane_router.body_writer"


@mypyc_attr(allow_interpreted_subclasses=True)
class BodyWriter:
    """Writes a started response's body without awaiting: the same bytes `send` would write for
    `http.response.body` messages. A base class, not a protocol: compiled, a relay's call for
    every read of a stream is then a direct one to the server's writer (router/httpserver/
    exchange.py), not a call by name."""

    __slots__ = ()

    def write_body(self, body: bytes, last: bool) -> bool:
        """Write `body` (and end the response when `last`); True while the client's transport
        is full, until `when_writable` calls back."""
        raise NotImplementedError

    def write_chunks(self, framed: bytes, body: bytes) -> bool:
        """`write_body(body, False)` for a part the caller also holds framed as whole chunks of
        a chunked body (`framed`: each a size line of hex digits, its bytes and CRLF, none the
        last; `body`, their bytes). A chunked response takes `framed` as it is, without framing
        it again; any other writes `body`."""
        raise NotImplementedError

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the client's transport takes writes again (at once if it does)."""
        raise NotImplementedError

    def unsent(self) -> int:
        """Bytes written toward the client that it has not received yet: the server's own write
        buffer plus the kernel's unacknowledged send queue, the part of a client's lag
        (router/lanes/slowclient.py) past the router; 0 once the client has gone."""
        raise NotImplementedError

    def unsent_at_most(self) -> int:
        """A bound of `unsent` that may be known without a system call (the bytes written since it
        was last asked, on top of its answer then); `unsent` itself where none is kept. A lag
        sample below its limit by this bound needs no other."""
        return self.unsent()

    def request_task(self) -> asyncio.Task[None] | None:
        """The task the server runs the app's call for this request in; None where the writer
        does not know it (the caller asks asyncio)."""
        return None

    def on_disconnect(self, callback: Callable[[], None]) -> bool:
        """Have `callback` called once, from the event loop, if the client goes away while the
        app still runs (soon after this call if it has gone already). False where the writer
        cannot tell: the caller then listens with `receive` (router/proxy/watch.py)."""
        return False

    def respond(self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> None:
        """The whole response at once: what `http.response.start` and one last
        `http.response.body` sent back to back would write, and the same errors."""
        raise NotImplementedError


def body_writer(scope: Scope) -> BodyWriter | None:
    extensions = scope.get("extensions")
    return extensions.get(BODY_WRITER) if extensions else None


async def send_bytes(
    send: Send, status: int, body: bytes, content_type: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, payload: Any, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send_bytes(send, status, orjson.dumps(payload), b"application/json", headers)


async def answer_lifespan(receive: Receive, send: Send) -> None:
    """The lifespan protocol for an app with nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def receive_body(receive: Receive) -> bytes:
    """A request's whole body, whatever its size: for the lab's and the tests' backends. The
    router's own handler reads with a limit (router/proxy/handler.py `read_body`). A client that
    goes away ends the body where it was."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)
