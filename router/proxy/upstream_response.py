"""An upstream response being read: status and headers at once, the body by iterating,
`read()`, or handed to a sink as it arrives (router/proxy/splice.py). Its connection goes back to
its pool (router/proxy/upstream.py) when the body ended, or is closed."""

from __future__ import annotations

from types import TracebackType

from router.proxy.upstream_body import BodySink
from router.proxy.upstream_connection import Lender, UpstreamConnection


class UpstreamResponse:
    """Status and headers of an upstream response; its body is read by iterating or `read()`.

    One consumer at a time. Once the body was iterated to its end the connection goes back to
    the pool by itself; `aclose()` is still required on every other path.
    """

    __slots__ = ("_conn", "_pool", "headers", "status")

    def __init__(self, pool: Lender, conn: UpstreamConnection) -> None:
        self._pool = pool
        self._conn: UpstreamConnection | None = conn
        self.status: int = conn.status
        self.headers: list[tuple[bytes, bytes]] = conn.headers  # as received, trailers dropped

    @property
    def at_end(self) -> bool:
        """Nothing more will come: the chunk just taken was the body's last (lets a relay mark
        its final write as final instead of sending an empty one after it)."""
        conn = self._conn
        return conn is None or conn.drained

    @property
    def buffered(self) -> int:
        """Body bytes received from the backend but not yet consumed (how far the reader lags)."""
        conn = self._conn
        return 0 if conn is None else conn.buffered

    async def wait_body(self) -> None:
        """Until the body has begun to arrive or has ended (an empty body): a failure before
        that is raised here, while the caller has not yet answered its own client."""
        conn = self._conn
        if conn is None:
            return
        try:
            await conn.wait_body()
        except BaseException:
            self.release()
            raise

    def attach(self, sink: BodySink) -> None:
        """Hand the body to `sink` as it is read (router/proxy/splice.py) instead of iterating."""
        conn = self._conn
        if conn is not None:
            conn.attach(sink)

    def detach(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.detach()

    def resume(self) -> None:
        """Read again after the attached sink asked to stop."""
        conn = self._conn
        if conn is not None:
            conn.resume_sink()

    def take_ready(self) -> bytes | None:
        """The body bytes already received, without waiting: b"" at the end of the body, None
        when none are here yet. `at_end` then tells whether they were the last."""
        conn = self._conn
        if conn is None:
            return b""
        try:
            return conn.take()
        except BaseException:
            self.release()
            raise

    def __aiter__(self) -> UpstreamResponse:
        return self

    def chunks(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        try:
            chunk = conn.take()
            if chunk is None:
                chunk = await conn.next_chunk()
        except BaseException:
            self.release()
            raise
        if chunk:
            return chunk
        self.release()
        raise StopAsyncIteration

    async def read(self) -> bytes:
        """The whole body."""
        conn = self._conn
        if conn is None:
            return b""
        parts = []
        try:
            while chunk := conn.take() or await conn.next_chunk():
                parts.append(chunk)
        finally:
            self.release()
        return b"".join(parts)

    async def aclose(self) -> None:
        """Return the connection if the body was fully read and keep-alive allowed; else close it now."""
        self.release()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        """`aclose` without awaiting."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.detach()
            self._pool.give_back(conn)
