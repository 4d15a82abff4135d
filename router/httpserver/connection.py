"""One client connection: runs its requests in order, applies the deadlines and closes when it
must. The reading half is router/httpserver/reader.py; each request is an `Exchange`
(router/httpserver/exchange.py) whose app runs in a task of its own.

One timer per connection (router/httpserver/deadlines.py) covers the deadline that applies in
the connection's phase: a complete head, the next request on a kept-alive connection, the next
body bytes. A read only stamps the time; the timer compares when it fires."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from httptools import HttpRequestParser

from router.httpserver.deadlines import INF
from router.httpserver.dispatch import run_app
from router.httpserver.exchange import Exchange
from router.httpserver.reader import (
    BODY_HELD,
    QUEUED,
    READ_BODY,
    READ_ENDING,
    READ_HEAD,
    READ_WAIT,
    STOPPED,
    RequestReader,
)
from router.httpserver.wire import client_error, send_queue

if TYPE_CHECKING:
    from router.httpserver.context import ServerContext

# After refusing a request the server stops reading but leaves the connection open this long,
# so the client can read the answer before the close resets the connection.
LINGER_S: Final = 1.0
# A closing connection whose client does not take the last bytes within this is reset.
CLOSE_FLUSH_S: Final = 30.0
# A request answered before its body arrived: the rest of the body is read and dropped for up
# to this long (clients write the whole body before they read), then the connection closes.
DRAIN_S: Final = 10.0
TASK_NAME: Final = "lane-router-request"
# What a lost connection's parser calls back: nothing (the parser it had calls the connection).
_NOBODY: Final = object()


class Connection(RequestReader):
    __slots__ = (
        "_active",
        "_counted",
        "_ctx",
        "_fd",
        "_queue",
        "_since",
        "_told_offset",
        "_transport_write",
        "_writable",
        "drain_waiter",
        "written",
    )

    def __init__(self, ctx: ServerContext, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(ctx.config, ctx.date, ctx.scheme, loop)
        self._ctx = ctx
        self._since = 0.0
        self._active: Exchange | None = None  # the request whose response is being made
        self._queue: deque[Exchange] = deque()
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self._writable: list[Callable[[], None]] = []  # called once writes are taken again
        self._fd = -1  # the socket's, while the connection is open; -1 when there is none
        self.written = 0  # bytes handed to the transport, every one through `write`
        # What `unsent` last found less `written` then: added to `written` now, a bound of the
        # bytes the client has not received that costs no system call (`unsent_at_most`).
        self._told_offset = 0
        # Plain TCP: the kernel queues the bytes written, so they bound its queue. Under TLS the
        # records it queues are larger than the bytes written, and the handshake's are not.
        self._counted = ctx.scheme == "http"

    # -- asyncio protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        # Bound once: a stream writes on every read, and a call by name looks the method up.
        self._transport_write: Callable[[bytes], object] = self.transport.write
        ctx = self._ctx
        limit = ctx.config.max_connections
        if ctx.closing or (limit and len(ctx.connections) >= limit):
            self._phase = READ_ENDING
            transport.close()
            return
        ctx.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._fd = sock.fileno()
            with contextlib.suppress(OSError):
                # Without it the first small write of a stream can wait for a delayed ACK.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for level, option, value in ctx.config.socket_options:
                    sock.setsockopt(level, option, value)
        self.endpoints = (
            _address(transport.get_extra_info("sockname")),
            _address(transport.get_extra_info("peername")),
        )
        self._since = self._last_read = self.loop.time()
        self.rearm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fd = -1  # closed: the number may soon name another socket
        self._ctx.forget(self)
        self._phase = READ_ENDING
        self.disarm()
        for ex in (self._active, self._parsing, *self._queue):
            if ex is not None:
                ex.gone()
        self._queue.clear()
        # The parser holds the connection's callbacks, and every exchange the connection: cycles
        # that would keep the connection, and its transport with a TLS connection's buffers,
        # until the cyclic collector runs.
        self._parsing = self._latest = None
        self._parser = HttpRequestParser(_NOBODY)
        self.write_paused = False
        self._writable.clear()  # the client is gone: nobody waits to write to it
        self._wake_writer()

    def eof_received(self) -> bool:
        return False  # a client that stops sending has gone: close, and tell the app

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    def when_writable(self, callback: Callable[[], None]) -> None:
        if self.write_paused:
            self._writable.append(callback)
        else:
            callback()

    def write(self, data: bytes) -> None:
        """Write to the client; every byte the server writes goes through here or `write_parts`,
        so `written` counts them all."""
        self.written += len(data)
        self._transport_write(data)

    def write_parts(self, parts: list[bytes]) -> None:
        """`write` of the parts joined, without joining them (one writev)."""
        for part in parts:
            self.written += len(part)
        self.transport.writelines(parts)

    def unsent(self) -> int:
        """Bytes written and not yet received by the client: the transport's buffer plus the
        kernel's unacknowledged send queue (the transport's alone where the platform does not
        tell the queue)."""
        buffered: int = self.transport.get_write_buffer_size()
        unsent = send_queue(self._fd) + buffered
        self._told_offset = unsent - self.written
        return unsent

    def unsent_at_most(self) -> int:
        """A bound of `unsent` without asking the kernel: what it found last time plus every byte
        written since (neither queue grows but by writes); `unsent` itself under TLS."""
        if not self._counted:
            return self.unsent()
        return self.written + self._told_offset

    def _wake_writer(self) -> None:
        if self._writable:
            callbacks, self._writable = self._writable, []
            for callback in callbacks:
                callback()
        waiter = self.drain_waiter
        if waiter is not None:
            self.drain_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def drain(self) -> None:
        """Wait until the transport takes writes again (or the connection is gone)."""
        waiter = self.drain_waiter
        if waiter is None or waiter.cancelled():  # cancelled: its waiter's task was
            waiter = self.drain_waiter = self.loop.create_future()
        await waiter

    # -- requests and responses -----------------------------------------------------------------

    def _accept(self, scope: dict[str, Any], keep_alive: bool, expect_continue: bool) -> Exchange:
        # Positional: keywords would cost a dict for every request.
        ex = Exchange(self, scope, keep_alive, expect_continue)
        if self._active is None:
            self._begin(ex)  # the read that ends in a body re-arms for the body's deadline
        else:
            self._queue.append(ex)
            self._pause(QUEUED)
        return ex

    def _head_started(self) -> None:
        if self._served and self._active is None:
            # A kept-alive connection: the head's clock starts at its first byte, which came
            # with the read being parsed now.
            since = self._since = self._last_read
            self.arm_by(since + self._config.head_timeout_s)

    def _drained(self) -> None:
        self._close()

    def _begin(self, ex: Exchange) -> None:
        self._active = ex
        # Named here: the loop's `create_task` would format a "Task-N" name for every request.
        ex.task = asyncio.Task(run_app(self._ctx, ex), loop=self.loop, name=TASK_NAME)

    def response_complete(self, ex: Exchange) -> None:
        if ex is not self._active:
            return
        if not ex.keep_alive or self.closing:
            if self._parsing is ex and not ex.withholds_body:
                # Answered before its body arrived: read the rest (and drop it), since the
                # client may read the answer only after it has sent everything.
                self._draining = True
                self._since = self.loop.time()
                self._resume(BODY_HELD)
                self.rearm()
            else:
                self._active = None
                self._close()
            return
        self._active = None
        if self._queue:
            self._begin(self._queue.popleft())
            if not self._queue:
                self._resume(QUEUED)
            return
        since = self._since = self.loop.time()
        if self._phase != READ_WAIT:
            self.rearm()
            return
        self.arm_by(since + self._config.keepalive_timeout_s)  # the usual case of `deadline`

    def resume_body(self) -> None:
        self._resume(BODY_HELD)

    def shutdown(self) -> None:
        """The server is stopping: close now if idle, else after the response in progress."""
        self.closing = True
        if self._active is not None:
            return
        if self._phase != READ_ENDING:
            self._close()
        elif self._paused & STOPPED:
            self.transport.abort()  # lingering after an answer: no reason to wait any longer

    def abort(self) -> None:
        self._phase = READ_ENDING
        self.transport.abort()

    def _refuse(self, answer: bytes | None) -> None:
        """Answer without calling the app (`answer` None: just end) and close. Behind a response
        in progress the answer cannot be written: the connection ends after that response."""
        self._refusal = None
        self._phase = READ_ENDING
        self._pause(STOPPED)
        active = self._active
        if active is not None:
            if active is not self._parsing:
                self.closing = True
                return
            # The request in progress has a malformed body: it gets the answer if its response
            # has not started, else the connection is dropped.
            self._active = self._parsing = None
            if answer is None or not active.reject(answer):
                self.abort()
                return
            answer = None
        if answer is not None:
            self.write(answer)
        self._close()

    def _close(self) -> None:
        """Close after the last response. With nothing unread the close is clean; otherwise the
        server stops reading and lingers, since closing over unread input resets the connection
        and can destroy the answer before the client reads it."""
        clean = self._phase == READ_WAIT and not self._queue
        self._phase = READ_ENDING
        for queued in self._queue:
            queued.gone()
        self._queue.clear()
        transport = self.transport
        if clean:
            transport.close()
            self.finally_after(CLOSE_FLUSH_S, transport.abort)
            return
        self._pause(STOPPED)
        if transport.can_write_eof():
            transport.write_eof()
        self.finally_after(LINGER_S, transport.abort)

    # -- deadlines --------------------------------------------------------------------------------

    def deadline(self) -> float:
        phase = self._phase
        config = self._config
        if phase == READ_BODY:
            if self._paused:
                return INF
            stall = self._last_read + config.body_timeout_s
            if self.in_trailer():  # a trailer is a head: complete in the head's time
                stall = min(stall, self._bare_since + config.head_timeout_s)
            return min(stall, self._since + DRAIN_S) if self._draining else stall
        if phase == READ_ENDING or self._active is not None:
            return INF  # a response in progress is bounded by the app, not by the server
        if phase == READ_HEAD or not self._served:
            return self._since + config.head_timeout_s
        return self._since + config.keepalive_timeout_s

    def expired(self) -> None:
        phase = self._phase
        if phase == READ_BODY:
            if self._draining:
                self._close()
            elif self.in_trailer():
                self._refuse(
                    client_error(self.date, 408, "the request trailer came too slowly", "request_timeout")
                )
            else:
                self.abort()  # the body stalled: the app sees a disconnect
        elif phase == READ_HEAD:
            self._refuse(client_error(self.date, 408, "the request head came too slowly", "request_timeout"))
        else:
            self._close()


def _address(name: Any) -> tuple[str, int] | None:
    if isinstance(name, tuple) and len(name) >= 2:
        return (str(name[0]), int(name[1]))
    return None
