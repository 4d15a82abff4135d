"""Relaying a response body from the upstream connection's read callback straight into the
client's socket, through the server's `BodyWriter` (router/app/asgi.py): each upstream read is
recorded (router/proxy/chunklog.py) and written at once, and the request's task is woken only
when the body ends, fails, or its client falls behind.

Flow control runs both ways without the task: a write that fills the client's transport stops
upstream reading until the transport drains. The client's lag is sampled every LAG_CHECK_S and
whenever its socket fills; a lagging client ends the splice, and the caller relays the rest
through a buffer (router/proxy/respond.py `_relay_decoupled`), starting with `pending`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

from router.app.asgi import BodyWriter
from router.errors import UpstreamError
from router.lanes.slowclient import LAG_CHECK_S
from router.proxy.chunklog import ChunkLog
from router.proxy.upstream_body import BodySink
from router.proxy.upstream_response import UpstreamResponse

DONE: Final = "done"
LAGGING: Final = "lagging"
Outcome = str | UpstreamError


class Splice(BodySink):
    """The sink of one response body (router/proxy/upstream_body.py `attach`). A read's common
    case (recorded, then written unless the lag sample is due) is run by the connection's read
    callback itself, with `record`, `sample_at` and `write` (router/proxy/upstream_connection.py):
    one call fewer per read. `sample` and `filled` are the rest of `relay`, for the reads that
    need them. `relay` takes one read's body bytes (`last`: the body ended with them) and says
    False to stop reading until the sink calls `UpstreamConnection.resume_sink`; `failed` takes
    the exchange's failure, after which nothing more comes."""

    __slots__ = (
        "_lagging",
        "_response",
        "_seen",
        "_writer",
        "outcome",
        "pending",
    )

    def __init__(
        self,
        seen: ChunkLog,
        writer: BodyWriter,
        response: UpstreamResponse,
        lagging: Callable[[], bool],
    ) -> None:
        self._seen = seen
        self._writer = writer
        self._response = response
        self._lagging = lagging
        self.sample_at = time.monotonic() + LAG_CHECK_S
        self.pending = b""  # a chunk read but not written, when the splice ended on a lagging client
        self.outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

    def record(self, data: bytes) -> float:
        """Record a read's arrival (router/proxy/chunklog.py); the time it was seen."""
        return self._seen.record(data)

    def write(self, data: bytes, last: bool) -> bool:
        """Write a read to the client; True while its transport is full."""
        return self._writer.write_body(data, last)

    def write_framed(self, framed: bytes, data: bytes) -> bool:
        """`write` of a read that is whole chunks as the backend framed them (`framed`; `data`,
        their bytes): a chunked response passes them on without framing them again."""
        return self._writer.write_chunks(framed, data)

    def relay(self, data: bytes, last: bool) -> bool:
        if data:
            now = self.record(data)
            if now >= self.sample_at and not last:
                return self.sample(data, now)
        if self.write(data, last):
            return self.filled()
        if last:
            self._settle(DONE)
        return True

    def sample(self, data: bytes, now: float) -> bool:
        """A read, not the body's last, recorded at `now` once the client's lag was due to be
        sampled: a lagging client ends the splice before the read is written."""
        self.sample_at = now + LAG_CHECK_S
        if self._lagging():
            self.pending = data
            self._settle(LAGGING)
            return False
        if self.write(data, False):
            return self.filled()
        return True

    def filled(self) -> bool:
        """The client's socket is full: False, reading stops. A client far behind is decoupled
        now; one that only paused is waited for, with upstream reads stopped until it drains."""
        if self._lagging():
            self._settle(LAGGING)
        else:
            self.sample_at = 0.0
            self._writer.when_writable(self._response.resume)
        return False

    def failed(self, exc: UpstreamError) -> None:
        self._settle(exc)

    def _settle(self, outcome: Outcome) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)
