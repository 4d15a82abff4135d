"""Relaying an opened response to the client (router/proxy/forward.py opens it).

A stream's every upstream read is written to the client as it arrives (bytes as received, never
re-encoded), under the headers `client_headers` lets through; a failure after its start ends it
with an SSE error event. A non-streamed response is held until its body is whole (up to
HELD_BODY_BYTES) and answered in one piece, so a backend that closes, resets or stalls mid-body
gets the client an error envelope (502, 504), never a 200 cut short. A longer one is relayed as
it arrives once past the bound, and cut short it drops the client connection without ending the
body. A stream's reads go from the upstream read callback straight to the client's socket
(router/proxy/splice.py). When the client falls behind (router.lanes.slowclient) the rest of the stream
is decoupled: a producer drains upstream into a bounded buffer and the relay feeds the client
from it."""

from __future__ import annotations

import asyncio
import time
from typing import Final

from router.app.asgi import BodyWriter, Send
from router.app.routes import ANTHROPIC_TARGETS
from router.errors import UpstreamError, anthropic_error_event, error_event
from router.lanes.slowclient import LAG_CHECK_S, StreamBuffer, client_identity, unsent_probe
from router.proxy.attempt import Attempt
from router.proxy.chunklog import ChunkLog
from router.proxy.response_headers import client_headers
from router.proxy.splice import DONE, LAGGING, Splice
from router.proxy.upstream_response import UpstreamResponse
from router.state.runtime import Runtime

# A non-streamed answer is held until it is whole up to this many bytes (answers are mostly a few
# KiB; a large batch of embeddings can be MiBs): past it the rest is relayed as it arrives.
HELD_BODY_BYTES: Final = 1024 * 1024


async def relay_response(runtime: Runtime, ex: Attempt, response: UpstreamResponse, send: Send) -> None:
    headers, is_sse = client_headers(response.headers, ex.response_headers)
    first = b""
    seen: ChunkLog | None = None
    if not is_sse:
        # A status once sent cannot be taken back: the body is held until it is whole, so a
        # backend that fails before its end still gets the client an error envelope.
        ready = response.take_ready()
        if ready is None:
            await response.wait_body()
            ready = response.take_ready()
        if ready is None or not response.at_end:
            seen = ChunkLog(ex, False)
            ready = await _held(response, seen, ready or b"")
        if response.at_end:
            # Mostly the whole body was here with the head: it goes out with it, in one write.
            writer = ex.writer
            if writer is not None:
                _answer_whole(ex, response.status, headers, ready, writer, seen)
            else:
                await _send_whole(ex, response.status, headers, ready, send, seen)
            return
        first = ready
    ex.status = response.status
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    ex.response_started = True
    if seen is None:
        seen = ChunkLog(ex, is_sse)
    try:
        if ex.lane.settings.decouple:
            await _relay_decoupled(runtime, response, send, seen, first)
        elif ex.writer is not None and is_sse:
            # A stream's reads go out from the read callback; a whole body is mostly in hand by
            # now, so the task writes it itself, which costs less than setting up a splice.
            await _relay_spliced(runtime, response, send, seen, ex.writer)
        else:
            await _relay_direct(runtime, response, send, seen, first)
    finally:
        ex.bytes_out = seen.bytes_out
        ex.gaps_timed = seen.gaps_timed
        ex.gaps_late = seen.gaps_late


async def _held(response: UpstreamResponse, seen: ChunkLog, first: bytes) -> bytes:
    """The body from `first` (its beginning, already taken) until its end, or until it is past
    HELD_BODY_BYTES, each read recorded as it arrives. A failure before either is raised:
    nothing has gone to the client yet."""
    parts = [first]
    size = len(first)
    if first:
        seen.record(first)
    while size <= HELD_BODY_BYTES and not response.at_end:
        chunk = response.take_ready()
        if chunk is None:
            await response.wait_body()
            continue
        seen.record(chunk)
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def _answer_whole(
    ex: Attempt,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    writer: BodyWriter,
    seen: ChunkLog | None,
) -> None:
    """The response in one piece: the head and the whole body, written together. `seen`: the
    log the body was recorded in as it arrived; None when it was taken in one read."""
    ex.status = status
    writer.respond(status, headers, body)
    ex.response_started = True
    _answered(ex, body, seen)


async def _send_whole(
    ex: Attempt,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    send: Send,
    seen: ChunkLog | None,
) -> None:
    """`_answer_whole` through `send`, for a server without a body writer."""
    ex.status = status
    await send({"type": "http.response.start", "status": status, "headers": headers})
    ex.response_started = True
    await send({"type": "http.response.body", "body": body, "more_body": False})
    _answered(ex, body, seen)


def _answered(ex: Attempt, body: bytes, seen: ChunkLog | None) -> None:
    if seen is None and body:
        seen = ChunkLog(ex, False)
        seen.record(body)
    if seen is not None:
        ex.bytes_out = seen.bytes_out
    ex.answered = True


async def _relay_spliced(
    runtime: Runtime, response: UpstreamResponse, send: Send, seen: ChunkLog, writer: BodyWriter
) -> None:
    """The body from the upstream read callback to the client's socket (router/proxy/splice.py);
    this task wakes only when it ends."""
    splice = Splice(seen, writer, response, lambda: _lagging(runtime, response, send, writer))
    response.attach(splice)
    try:
        outcome = await splice.outcome
    finally:
        response.detach()
    if outcome == DONE:
        if seen.is_sse and _lagging(runtime, response, send, writer):
            # The whole answer fit in the socket buffers, but the client is far behind it.
            _mark_slow(runtime, seen.ex)
    elif outcome == LAGGING:
        _mark_slow(runtime, seen.ex)
        await _relay_decoupled(runtime, response, send, seen, splice.pending)
    else:
        assert isinstance(outcome, UpstreamError)
        await _end_with_error(outcome, seen, send)


async def _relay_direct(
    runtime: Runtime, response: UpstreamResponse, send: Send, seen: ChunkLog, first: bytes = b""
) -> None:
    """`first`: the body's beginning, already taken from the response and recorded."""
    # The client's lag is sampled every LAG_CHECK_S; a write that blocked on a full client
    # socket makes the next sample due at once.
    next_check = time.monotonic() + LAG_CHECK_S
    more = True
    record = seen.record
    writer = seen.ex.writer
    if first:
        await send({"type": "http.response.body", "body": first, "more_body": True})
    try:
        async for chunk in response:
            now = record(chunk)
            if now >= next_check:
                next_check = now + LAG_CHECK_S
                if _lagging(runtime, response, send, writer):
                    _mark_slow(runtime, seen.ex)
                    await _relay_decoupled(runtime, response, send, seen, chunk)
                    return
            more = not response.at_end
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
            if not more:
                seen.ex.answered = True
    except UpstreamError as err:
        await _end_with_error(err, seen, send)
        return
    if more:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        seen.ex.answered = True
    elif seen.is_sse and _lagging(runtime, response, send, writer):
        # The whole answer fit in the socket buffers, but the client is far behind it.
        _mark_slow(runtime, seen.ex)


def _lagging(runtime: Runtime, response: UpstreamResponse, send: Send, writer: BodyWriter | None) -> bool:
    """Bytes not yet delivered to the client: still upstream-side, and already written but
    unacknowledged (told by the server's body writer when there is one: compiled, no lookups)."""
    if writer is not None:
        lag, buffered = runtime.lag, response.buffered
        # The bound first: a connection that has not written the limit since its socket was last
        # asked cannot be past it, and is not asked again (a short stream asks nothing).
        return lag.lagging(buffered + writer.unsent_at_most()) and lag.lagging(buffered + writer.unsent())
    probe = unsent_probe(send)
    return runtime.lag.lagging(response.buffered + (probe() if probe is not None else 0))


async def _end_with_error(err: UpstreamError, seen: ChunkLog, send: Send) -> None:
    if not seen.is_sse:
        # A JSON body cut short cannot be mended; dropping the connection tells the client.
        raise ResponseAborted(str(err)) from err
    # The event in the route's own envelope: Anthropic's clients read an `error` event.
    event = anthropic_error_event(err) if seen.ex.target in ANTHROPIC_TARGETS else error_event(err)
    await send({"type": "http.response.body", "body": event, "more_body": False})


def _mark_slow(runtime: Runtime, ex: Attempt) -> None:
    key_name, client_id, address = ex.client
    runtime.slow_clients.mark(client_identity(key_name, client_id, address), time.monotonic())
    runtime.metrics.slow_clients.labels(ex.lane.name).inc()


async def _relay_decoupled(
    runtime: Runtime, response: UpstreamResponse, send: Send, seen: ChunkLog, pending: bytes = b""
) -> None:
    """Feed the client from a buffer that a producer task fills from upstream at the backend's
    pace; the producer waits only when the buffer caps are reached. `pending` is a chunk already
    seen and not yet sent."""
    buffer = StreamBuffer(runtime.buffers, runtime.config.slow_clients.max_stream_buffer_bytes)
    if pending:
        await buffer.put(pending)
    producer = asyncio.ensure_future(_pump(response, buffer, seen))
    # No await in a `finally` of this compiled module (docs/compiled.md): stopped on every way out.
    try:
        while (data := await buffer.get()) is not None:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        error = buffer.error
        if isinstance(error, UpstreamError):
            await _end_with_error(error, seen, send)
        elif error is not None:
            raise error
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            seen.ex.answered = True
    except BaseException as exc:
        await _stop(producer, buffer)
        raise exc  # named, not bare: docs/compiled.md
    await _stop(producer, buffer)


async def _stop(producer: asyncio.Future[None], buffer: StreamBuffer) -> None:
    producer.cancel()
    try:
        await asyncio.gather(producer, return_exceptions=True)
    finally:
        buffer.release()


async def _pump(response: UpstreamResponse, buffer: StreamBuffer, seen: ChunkLog) -> None:
    record = seen.record
    try:
        async for chunk in response:
            record(chunk)
            await buffer.put(chunk)
    except UpstreamError as err:
        buffer.end(err)
        return
    except BaseException as err:
        buffer.end(err)
        raise
    seen.backend_done()
    buffer.end()


class ResponseAborted(Exception):
    """The response had started when the backend failed and cannot be ended cleanly: the
    server must drop the client connection (the only signal left for a cut-short body)."""
