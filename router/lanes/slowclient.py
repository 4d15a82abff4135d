"""Slow-client isolation: noticing a client that reads slower than its backend writes, taking the
backend off its pace, and remembering the client.

A relay writes each upstream read to the client; the ASGI server's `send` waits only once the
server's own write buffer is full, and the kernel's send buffer in front of it grows to MiBs
(Linux autotunes it up to tcp_wmem's maximum, 4 MiB by default), so most of a slow client's lag
sits in the kernel. A client *lags* when the bytes not yet delivered to it — received from
upstream and not yet written, plus those in the server transport's buffer and the kernel's
unacknowledged send queue (`unsent_probe`) — exceed `lag_bytes` (router/state/runtime.py `LagPolicy`,
compiled with the request path, which asks it at every sample). The relay samples this every
LAG_CHECK_S (a write that blocked on a full socket makes the next sample due at once) and at
the end of each stream. A lagging stream is then
*decoupled*: a producer task drains upstream into a `StreamBuffer` (so the backend finishes at
engine speed and frees its slot), while the relay feeds the client from the buffer. Buffers are
capped per stream and, through one `BufferBudget`, in total; past a cap the producer waits
(backpressure) — bytes are never dropped. The client's identity goes into `SlowClients`, so
its next streams are classified `slow_stream`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from router.httpserver.wire import TELLS_SEND_QUEUE, send_queue

# How often a stream's lag toward its client is sampled (one ioctl per sample).
LAG_CHECK_S = 0.1


class SlowClientStore(Protocol):
    """Slow-client memory shared with other router replicas."""

    def publish(self, identity: str, ttl_s: float) -> None:
        """Remember `identity` for `ttl_s` seconds, in the background."""
        ...

    async def remaining(self, identity: str) -> float | None:
        """How much longer `identity` is remembered; None when it is not (or cannot be told)."""
        ...


class SlowClients:
    """Client identities recently seen lagging, each remembered for `ttl_s`; at most
    `max_entries`, the oldest forgotten first. With a `shared` store, marks are published to the
    other replicas and `recall` asks them about clients this one has not seen lag."""

    def __init__(self, ttl_s: float, max_entries: int, shared: SlowClientStore | None = None) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._until: OrderedDict[str, float] = OrderedDict()
        self.shared = shared

    def __len__(self) -> int:
        return len(self._until)

    def mark(self, identity: str, now: float) -> None:
        self._remember(identity, now + self._ttl)
        if self.shared is not None:
            self.shared.publish(identity, self._ttl)

    def _remember(self, identity: str, until: float) -> None:
        self._until.pop(identity, None)
        self._until[identity] = until
        while len(self._until) > self._max:
            self._until.popitem(last=False)

    def is_slow(self, identity: str, now: float) -> bool:
        """What this replica remembers."""
        until = self._until.get(identity)
        if until is None:
            return False
        if until < now:
            del self._until[identity]
            return False
        return True

    async def recall(self, identity: str, now: float) -> bool:
        """What this replica or, failing that, the shared store remembers; a client found in the
        store is then remembered here for as long as the store still keeps it."""
        if self.is_slow(identity, now):
            return True
        if self.shared is None:
            return False
        remaining = await self.shared.remaining(identity)
        if remaining is None:
            return False
        self._remember(identity, now + remaining)
        return True


def unsent_probe(send: Any) -> Callable[[], int] | None:
    """A function giving the bytes written toward the client that it has not yet received: the
    server transport's buffer plus the kernel's unacknowledged send queue. The transport is
    found on the ASGI server's response cycle (the router's server, router/httpserver/exchange.py,
    makes `send` a method of an object holding it); None when the server or the platform does
    not tell."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None or not TELLS_SEND_QUEUE:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    fd = sock.fileno()
    if fd < 0:  # the client has already gone
        return None
    buffered: Callable[[], int] = transport.get_write_buffer_size

    def unsent() -> int:
        return send_queue(fd) + buffered()

    return unsent


def client_identity(key_name: str, client_id: bytes | None, address: str | None) -> str:
    """The key plus the client's own id (`X-Client-Id`) or, without one, its address: two clients
    behind one key are told apart, and one client cannot mark another key's clients slow."""
    if client_id:
        return f"{key_name}\x00id\x00{client_id[:128].decode('latin-1')}"
    return f"{key_name}\x00ip\x00{address or '-'}"


class BufferBudget:
    """Bytes held by all stream buffers together, with waiters for room."""

    def __init__(self, cap: int, on_change: Callable[[int], None] | None = None) -> None:
        self.cap = cap
        self.used = 0
        self._on_change = on_change
        self._waiters: deque[asyncio.Future[None]] = deque()

    def has_room(self) -> bool:
        return self.used < self.cap

    def add(self, n: int) -> None:
        self.used += n
        if self._on_change is not None:
            self._on_change(self.used)

    def remove(self, n: int) -> None:
        self.used -= n
        if self._on_change is not None:
            self._on_change(self.used)
        while self._waiters and self.used < self.cap:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def wait_for_room(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            fut.cancel()


class StreamBuffer:
    """One decoupled stream's bytes between the producer (upstream) and the relay (client)."""

    def __init__(self, budget: BufferBudget, cap: int) -> None:
        self._budget = budget
        self._cap = cap
        self._chunks: deque[bytes] = deque()
        self.size = 0
        self.ended = False
        self.error: BaseException | None = None
        self._readable: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    async def put(self, chunk: bytes) -> None:
        # An empty buffer always takes a chunk, so a stream can make progress whatever the caps.
        while self.size and (self.size >= self._cap or not self._budget.has_room()):
            if self.size >= self._cap:
                self._writable = asyncio.get_running_loop().create_future()
                try:
                    await self._writable
                finally:
                    self._writable = None
            else:
                await self._budget.wait_for_room()
        self._chunks.append(chunk)
        self.size += len(chunk)
        self._budget.add(len(chunk))
        self._wake_reader()

    def end(self, error: BaseException | None = None) -> None:
        self.ended = True
        self.error = error
        self._wake_reader()

    async def get(self) -> bytes | None:
        """Everything buffered, as one chunk; None once the producer ended and all was taken
        (then `error` tells whether it ended in failure)."""
        while not self._chunks:
            if self.ended:
                return None
            self._readable = asyncio.get_running_loop().create_future()
            try:
                await self._readable
            finally:
                self._readable = None
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.size -= len(data)
        self._budget.remove(len(data))
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)
        return data

    @property
    def pending(self) -> bool:
        return bool(self._chunks)

    def release(self) -> None:
        """Give the budget back for bytes never sent (the client went away)."""
        if self.size:
            self._budget.remove(self.size)
            self.size = 0
            self._chunks.clear()

    def _wake_reader(self) -> None:
        readable = self._readable
        if readable is not None and not readable.done():
            readable.set_result(None)
