"""One request and its response: the `receive` and `send` an ASGI app is called with.

The request body arrives from the connection (`feed`, `end_body`) and waits in a list of chunks
until the app asks for it; a future is created only when the app asks before anything arrived.
`send` writes each body message with one transport write and awaits only while the transport
has paused writing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Final, NewType

from router.app.asgi import BODY_WRITER, BodyWriter
from router.httpserver.framing import CHUNKED, LENGTH, NO_BODY, chunk, plan_response
from router.httpserver.link import ClientLink
from router.httpserver.wire import CONTINUE, JOIN_LIMIT, LAST_CHUNK, internal_error

Message = dict[str, Any]

# Response states: a type of their own, so mypy refuses another vocabulary's values here (a
# NewType costs nothing compiled: it is its base type there).
ResponseState = NewType("ResponseState", int)
RESPONSE_NEW: Final = ResponseState(0)
RESPONSE_STARTED: Final = ResponseState(1)
RESPONSE_DONE: Final = ResponseState(2)


class Exchange(BodyWriter):
    __slots__ = (
        "_body_done",
        "_body_sent",
        "_buffered",
        "_chunks",
        "_conn",
        "_continue",
        "_framing",
        "_gone",
        "_head",
        "_length",
        "_on_gone",
        "_over",
        "_waiter",
        "event_stream",
        "keep_alive",
        "scope",
        "state",
        "status",
        "task",
        "transport",
    )

    def __init__(
        self, conn: ClientLink, scope: dict[str, Any], keep_alive: bool, expect_continue: bool
    ) -> None:
        # `send.__self__.transport` is how router/lanes/slowclient.py `unsent_probe` finds the socket.
        self.transport = conn.transport
        scope["extensions"] = {BODY_WRITER: self}
        self.scope = scope
        self.keep_alive = keep_alive
        self.state = RESPONSE_NEW
        self.status = 0
        self.event_stream = False
        self.task: asyncio.Task[None] | None = None
        self._conn = conn
        self._continue = expect_continue
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._over = False  # the connection paused reading for this body
        self._body_done = False
        self._body_sent = False
        self._waiter: asyncio.Future[None] | None = None
        self._gone = False
        self._on_gone: Callable[[], None] | None = None
        self._head: bytes | None = None
        self._framing = NO_BODY
        self._length = -1

    # -- the request side, fed by the connection --------------------------------------------

    def feed(self, data: bytes, high_water: int) -> bool:
        """Keep body bytes for the app; True when they now exceed `high_water` for the first
        time (the connection then pauses reading until the app takes them)."""
        if self.state == RESPONSE_DONE:
            return False  # answered already: the rest of the body is dropped
        self._chunks.append(data)
        self._buffered += len(data)
        if self._waiter is not None:
            self._wake()
        if self._buffered > high_water and not self._over:
            self._over = True
            return True
        return False

    @property
    def is_gone(self) -> bool:
        return self._gone

    @property
    def withholds_body(self) -> bool:
        """The client waits for a 100 Continue that was never sent: its body will not come."""
        return self._continue

    def end_body(self) -> None:
        self._body_done = True
        if self._waiter is not None:
            self._wake()

    def gone(self) -> None:
        """The connection is closed: `receive` reports the disconnect, `send` writes nothing,
        and the app's disconnect callback (`on_disconnect`) is called."""
        self._gone = True
        if self._waiter is not None:
            self._wake()
        told = self._on_gone
        if told is not None:
            self._on_gone = None
            # On the next loop turn, as a task waiting on `receive` would hear it: the
            # connection first wakes what waits on it (a drain).
            self._conn.loop.call_soon(told)

    def _wake(self) -> None:
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def receive(self) -> Message:
        while True:
            chunks = self._chunks
            if chunks:
                # Taken here, not in a call: every request with a body comes this way.
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                more = not self._body_done
                if not more:
                    self._body_sent = True
                if self._over:
                    self._over = False
                    self._conn.resume_body()
                return {"type": "http.request", "body": body, "more_body": more}
            if self._body_done and not self._body_sent:
                self._body_sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if self._gone or (self._body_sent and self.state == RESPONSE_DONE):
                return {"type": "http.disconnect"}
            await self._wait()

    async def _wait(self) -> None:
        """Until the body moves on or the connection ends; a return after a cancellation that
        was not this task's own too."""
        if self._continue:
            self._send_continue()
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = self._conn.loop.create_future()
        try:
            await waiter
        except asyncio.CancelledError:
            if self._waiter is waiter:
                self._waiter = None
            # A second receiver shares the future; only this task's own cancellation counts.
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise

    def _send_continue(self) -> None:
        self._continue = False
        if self.state == RESPONSE_NEW and not self._gone:
            self._conn.write(CONTINUE)

    # -- the response side --------------------------------------------------------------------

    async def send(self, message: Message) -> None:
        if self._gone:
            return  # the client has gone: nothing more is written, and that is no error
        kind = message["type"]
        if kind == "http.response.body":
            if self.state != RESPONSE_STARTED:
                raise RuntimeError("http.response.body sent " + _ORDER[self.state])
            more = message.get("more_body", False)
            self._write(message.get("body", b""), more)
            if not more:
                self._finish()
            elif self._conn.write_paused:
                await self._conn.drain()
        elif kind == "http.response.start":
            self._start(message)
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")

    def write_body(self, body: bytes, last: bool) -> bool:
        """`BodyWriter` (router/app/asgi.py): a body part written at once, without awaiting."""
        if self._gone or self.state != RESPONSE_STARTED:
            return False
        if self._framing == CHUNKED and not last and 0 < len(body) <= JOIN_LIMIT:
            # A stream's every read takes this way: its head went out at the start, so the
            # part is framed and written here without the general `_write`'s branches.
            self._conn.write(b"%x\r\n%b\r\n" % (len(body), body))
            return self._conn.write_paused
        self._write(body, not last)
        if last:
            self._finish()
            return False
        return self._conn.write_paused

    def write_chunks(self, framed: bytes, body: bytes) -> bool:
        """`BodyWriter` (router/app/asgi.py): a paced stream's read as its backend framed it."""
        if self._framing == CHUNKED and self.state == RESPONSE_STARTED and not self._gone:
            self._conn.write(framed)
            return self._conn.write_paused
        return self.write_body(body, False)

    def when_writable(self, callback: Callable[[], None]) -> None:
        self._conn.when_writable(callback)

    def unsent(self) -> int:
        return 0 if self._gone else self._conn.unsent()

    def unsent_at_most(self) -> int:
        return 0 if self._gone else self._conn.unsent_at_most()

    def request_task(self) -> asyncio.Task[None] | None:
        return self.task

    def on_disconnect(self, callback: Callable[[], None]) -> bool:
        """`BodyWriter` (router/app/asgi.py): told by the connection's loss (`gone`), without a
        task that waits on `receive` for it."""
        if self._gone:
            self._conn.loop.call_soon(callback)
        else:
            self._on_gone = callback
        return True

    def respond(self, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> None:
        """`BodyWriter` (router/app/asgi.py): a whole response, as a start and a last body message
        sent back to back would make it, its head and body in one write."""
        if self._gone:
            return
        head = self._plan(status, headers)
        n = len(body)
        if self._framing == LENGTH and n <= JOIN_LIMIT:
            # The usual answer, without `_write`'s other framings; a body of the length it
            # declared needs no other check.
            if n == self._length:
                self._length = 0
            else:
                self._count(n, False)
            self._conn.write(head + body)
        else:
            self._head = head
            self._write(body, False)
        self._finish()

    def _start(self, message: Message) -> None:
        head = self._plan(message["status"], message.get("headers", ()))
        if self._framing == CHUNKED:
            # A stream: its head leaves now, as the client's own timing (and the lag the relay
            # measures from the socket, router/lanes/slowclient.py) starts with it.
            self._conn.write(head)
            return
        # A whole answer: the head waits for the first body message to leave in one write with
        # it, or for the next loop turn if the app is still working on its body then.
        self._head = head
        self._conn.loop.call_soon(self._flush_head)

    def _plan(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The response has started: its head, and how its body goes out."""
        if self.state != RESPONSE_NEW:
            raise RuntimeError("http.response.start sent twice")
        scope = self.scope
        conn = self._conn
        # Positional: every response makes this call.
        head, framing, self._length, keep_alive, self.event_stream = plan_response(
            status,  # raises on an invalid start: nothing sent, the app's error is a 500
            headers,
            scope["method"] == "HEAD",
            scope["http_version"] == "1.1",
            # An unread request body cannot be skipped safely: the connection ends after this.
            # Body bytes the app left in the buffer are unread too (a 413 over a body that
            # arrived whole), and they hold the connection's reading paused.
            self.keep_alive and self._body_done and not self._chunks and not conn.closing,
            conn.date,
        )
        self.state = RESPONSE_STARTED
        self.status = status
        self._framing = framing
        self.keep_alive = keep_alive
        return head

    def _flush_head(self) -> None:
        head = self._head
        if head is not None and not self._gone:
            self._head = None
            self._conn.write(head)

    def _write(self, body: bytes, more: bool) -> None:
        framing = self._framing
        if framing == CHUNKED:
            if len(body) > JOIN_LIMIT:
                self._emit_large(b"%x\r\n" % len(body), body, b"\r\n" if more else b"\r\n" + LAST_CHUNK)
                return
            data = chunk(body, not more) if body else (b"" if more else LAST_CHUNK)
        elif framing == NO_BODY:
            data = b""
        else:
            if framing == LENGTH:
                self._count(len(body), more)
            if len(body) > JOIN_LIMIT:
                self._emit_large(b"", body, b"")
                return
            data = body
        head = self._head
        if head is not None:
            self._head = None
            data = head + data
        if data:
            self._conn.write(data)

    def _emit_large(self, before: bytes, body: bytes, after: bytes) -> None:
        head = self._head
        self._head = None
        parts = [p for p in (head, before, body, after) if p]
        self._conn.write_parts(parts)

    def _count(self, n: int, more: bool) -> None:
        left = self._length - n
        self._length = left
        if left < 0:
            raise RuntimeError("response body longer than its content-length")
        if left and not more:
            self.keep_alive = False  # a short body: closing the connection tells the client

    def _finish(self) -> None:
        self.state = RESPONSE_DONE
        if self._waiter is not None:
            self._wake()
        self._conn.response_complete(self)

    # -- ends the app did not choose ------------------------------------------------------------

    def fail(self) -> None:
        """The app raised: a 500 if nothing was sent yet, else the connection is dropped."""
        if self.state == RESPONSE_NEW and not self._gone:
            self.state = RESPONSE_DONE
            self.status = 500
            self.keep_alive = False
            self._conn.write(internal_error(self._conn.date))
            self._conn.response_complete(self)
        else:
            self.drop()

    def reject(self, answer: bytes) -> bool:
        """The request turned out malformed after the app was called: answer it here if its
        response has not started (the app then sees a disconnect). False if too late."""
        if self.state != RESPONSE_NEW or self._gone:
            return False
        self.state = RESPONSE_DONE
        self.status = int(answer[9:12])
        self._conn.write(answer)
        self.gone()
        return True

    def drop(self) -> None:
        """Cut the response where it is: the client sees a body that never ended."""
        if self.state != RESPONSE_DONE:
            self.state = RESPONSE_DONE
            self._conn.abort()

    def cut(self, event: bytes) -> None:
        """End the response at shutdown: an event stream gets `event` and its terminator, so the
        client learns why it ended; any other unfinished response is dropped."""
        if (
            self.state == RESPONSE_STARTED
            and self._framing == CHUNKED
            and self.event_stream
            and not self._gone
        ):
            self.keep_alive = False
            self._write(event, False)
            self._finish()
        else:
            self.drop()

    def release(self) -> None:
        """The app has returned: its scope's body writer (this exchange) and its task are no
        longer needed. Dropped, they no longer tie the exchange, scope, task and coroutine into a
        cycle, so all of it is freed at once instead of piling up for the cycle collector."""
        self.task = None
        self._on_gone = None
        self.scope["extensions"] = {}


_ORDER: Final = ("before http.response.start", "", "after the response was complete")
