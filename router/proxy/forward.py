"""Sending one admitted request to a backend of its lane's pool and relaying the answer.

Admission (router.poolgate) hands out the backend; the request holds its ticket until it ends. The
relay writes every upstream read to the client as it arrives (bytes as received, never
re-encoded), under the headers `client_headers` lets through. A backend may be swapped for
another only while it provably has not started the request (`UpstreamError.retryable`, or vLLM's
503 from its queue limit): a request once written is never sent again. A non-streamed response's
status waits for its body to begin, so a backend dying in between still gets the client an error
envelope; a stream starts at once, and a failure after that ends it with an SSE error event.
When the client falls behind (router.slowclient) the rest of the stream is decoupled: a producer
drains upstream into a bounded buffer and the relay feeds the client from it. Every counter taken
here is given back by `finish`, which the caller (router/proxy/relay.py) runs in its `finally`,
whatever ends the request: success, upstream failure, client disconnect."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from router import health
from router.asgi import BodyWriter, Send
from router.errors import (
    RouterError,
    Unavailable,
    UpstreamAuthFailed,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    error_event,
)
from router.poolgate import PoolGate, Ticket
from router.proxy.chunklog import ChunkLog, UsageTail
from router.proxy.response_headers import client_headers
from router.proxy.splice import DONE, LAGGING, Splice
from router.proxy.upstream import UpstreamResponse
from router.requestrecord import RequestRecord
from router.runtime import Backend, Lane, Runtime
from router.slowclient import LAG_CHECK_S, StreamBuffer, client_identity, unsent_probe

log = logging.getLogger("lane_router.forward")

# A wrong pool key fails every request: one warning per backend per interval says it.
AUTH_WARNING_EVERY_S = 60.0
# Failures before a response that speak of the backend's health, not of one request.
_SICK = (UpstreamConnectError, UpstreamClosed)


class Exchange:
    """The per-request state the relay and its caller share. A plain slotted class, not a
    dataclass: one is built per request, so `__init__` takes what the caller knows (positional
    is cheapest) and sets the relay's own state from constants."""

    __slots__ = (
        "accept",
        "answered",
        "body",
        "bytes_out",
        "client",
        "content_type",
        "first_byte_at",
        "lane",
        "method",
        "observe_gap",
        "on_chunk",
        "prompt_tokens",
        "record",
        "request_id",
        "response_headers",
        "response_started",
        "started",
        "status",
        "stream",
        "target",
        "ticket",
        "trace_headers",
        "usage_tail",
        "writer",
    )

    def __init__(
        self,
        lane: Lane,
        target: bytes,
        body: bytes,
        request_id: bytes,
        accept: bytes | None,
        ticket: Ticket,
        started: float,
        response_headers: list[tuple[bytes, bytes]],
        observe_gap: Callable[[float], None],
        record: RequestRecord,
        stream: bool = True,
        prompt_tokens: int = 0,
        client: tuple[str, bytes | None, str | None] = ("", None, None),
        usage_tail: UsageTail | None = None,
        writer: BodyWriter | None = None,
        method: bytes = b"POST",
        trace_headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        self.lane = lane
        self.target = target
        self.body = body
        self.request_id = request_id
        self.accept = accept
        self.ticket = ticket
        self.started = started
        self.response_headers = response_headers
        self.observe_gap = observe_gap
        self.record = record  # what the observers read at the end (router/requestrecord.py)
        self.stream = stream
        self.prompt_tokens = prompt_tokens
        self.client = client  # key, X-Client-Id, address
        self.usage_tail = usage_tail  # the response's last bytes, kept when usage is wanted
        self.writer = writer  # the server's direct body writer, when it has one
        self.method = method
        self.trace_headers = trace_headers  # traceparent/tracestate for the backend
        self.content_type = b"application/json"
        self.on_chunk: Callable[[bytes], None] | None = None  # sees each upstream chunk (response ids)
        self.response_started = False
        self.first_byte_at: float | None = None
        self.status = 0
        self.bytes_out = 0
        # The last body message went out: the server reports a disconnect from then on (ASGI),
        # and that is the exchange ending, not the client leaving.
        self.answered = False


def upstream_fields(pool_key: bytes | None, ex: Exchange) -> tuple[bytes, int]:
    """The request's header lines for the backend, written out, and how many there are: its
    content type, what it accepts, its id, the pool's key, and its trace context."""
    auth = b"authorization: Bearer %s\r\n" % pool_key if pool_key else b""
    fields = b"content-type: %s\r\naccept: %s\r\nx-request-id: %s\r\n%s" % (
        ex.content_type,
        ex.accept or b"*/*",
        ex.request_id,
        auth,
    )
    lines = 4 if auth else 3
    trace = ex.trace_headers
    if not trace:
        return fields, lines
    return fields + b"".join([b"%s: %s\r\n" % field for field in trace]), lines + len(trace)


def finish(ex: Exchange, gate: PoolGate, response: UpstreamResponse | None) -> None:
    """Give back what the exchange holds: its admission at `gate` (the one it was admitted by,
    though a reload may since have given its lane another pool), and the response's connection."""
    gate.finish(ex.ticket)
    if response is not None:
        response.release()


async def _wait_for_room(ex: Exchange, gate: PoolGate) -> Backend:
    began = time.monotonic()
    try:
        return await gate.acquire(ex.ticket)
    finally:
        ex.lane.queue_time.observe(time.monotonic() - began)


def _hold_blind_prefill(ex: Exchange, gate: PoolGate) -> None:
    """A non-streamed response shows no first token: count it as prefilling for the pool's
    estimate of its prefill time, if the pool gives one (else until the response starts)."""
    limits = gate.limits
    hold = limits.blind_hold_s(ex.prompt_tokens)
    if hold is not None and limits.enabled:
        ticket = ex.ticket
        ticket.timer = asyncio.get_running_loop().call_later(hold, gate.end_prefill, ticket)


async def open_response(runtime: Runtime, ex: Exchange, gate: PoolGate) -> UpstreamResponse:
    """Admit the request and open its upstream response, retrying other backends before the
    first byte. Whatever it takes is given back by `finish`."""
    pool = ex.lane.pool
    fields, lines = upstream_fields(pool.upstream_key, ex)
    ticket = ex.ticket
    last_error: RouterError | None = None
    metrics = runtime.metrics
    while True:
        if last_error is None:
            # The common case, nobody waiting and a slot free, without a coroutine or a clock read.
            found = None if gate.waiting else gate.try_take(ticket)
            if found is not None:
                ex.lane.queue_time.observe(0.0)
                backend = found
            else:
                backend = await _wait_for_room(ex, gate)
        else:
            try:
                backend = await gate.acquire(ticket)
            except Unavailable:
                raise last_error from None
            metrics.retries.labels(pool.name).inc()
            ex.record.retries += 1
        # Without the pool's prefill rate there is no estimate: held until the response starts.
        if not ex.stream and gate.limits.prefill_tokens_per_s is not None:
            _hold_blind_prefill(ex, gate)
        rec = ex.record
        if rec.admitted_at is None:
            rec.admitted_at = time.monotonic()
        rec.backend = backend.index
        try:
            response = await backend.upstream.request_fields(ex.method, ex.target, fields, lines, ex.body)
        except UpstreamError as err:
            gate.retry_elsewhere(ticket)
            metrics.upstream_errors.labels(pool.name, backend.name, err.code).inc()
            if isinstance(err, _SICK):
                health.note_failure(backend, runtime.config.health, runtime.metrics)
            if err.retryable:  # the request never reached the backend
                last_error = err
                continue
            raise
        status = response.status
        if status == 401 or status == 403:
            # The backend refused the router's own credentials: not the client's 401/403.
            gate.retry_elsewhere(ticket)
            await response.aclose()
            raise _auth_failed(runtime, backend, status)
        if status == 503:
            # vLLM's queue limit answers 503 before doing any work: safe to try a sibling.
            metrics.upstream_errors.labels(pool.name, backend.name, "upstream_503").inc()
            gate.retry_elsewhere(ticket)
            await response.aclose()
            last_error = Unavailable(
                f"pool {pool.name!r}: every backend is at its queue limit",
                code="backend_overloaded",
                retry_after=1,
            )
            continue
        if backend.consecutive_failures:
            health.note_success(backend)
        rec.connected_at = time.monotonic()
        return response


def auth_warning_due(last: float | None, now: float) -> bool:
    return last is None or now - last >= AUTH_WARNING_EVERY_S


def _auth_failed(runtime: Runtime, backend: Backend, status: int) -> UpstreamAuthFailed:
    code = UpstreamAuthFailed.code
    runtime.metrics.upstream_errors.labels(backend.pool, backend.name, code).inc()
    now = time.monotonic()
    if auth_warning_due(backend.auth_failure_logged_at, now):
        backend.auth_failure_logged_at = now
        log.warning(
            "backend %s of pool %s answers HTTP %d: it refuses the pool's upstream key "
            "(upstream_api_key / upstream_api_key_env); further refusals stay silent for %gs",
            backend.name,
            backend.pool,
            status,
            AUTH_WARNING_EVERY_S,
        )
    return UpstreamAuthFailed(f"{backend.label}: the backend refused the router's credentials")


async def relay_response(runtime: Runtime, ex: Exchange, response: UpstreamResponse, send: Send) -> None:
    headers, is_sse = client_headers(response.headers, ex.response_headers)
    first = b""
    if not is_sse:
        # A status once sent cannot be taken back: wait until the body begins, so a backend
        # that fails in between still gets the client an error envelope, not a 200 cut short.
        writer = ex.writer
        if writer is None or ex.lane.settings.decouple:
            await response.wait_body()
        else:
            # Mostly the whole body is here by now: it goes out with the head, in one write.
            ready = response.take_ready()
            if ready is None:
                await response.wait_body()
                ready = response.take_ready()
            first = ready or b""
            if response.at_end:
                _answer_whole(ex, response.status, headers, first, writer)
                return
    ex.status = response.status
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    ex.response_started = True
    seen = ChunkLog(ex, is_sse)
    if ex.lane.settings.decouple:
        await _relay_decoupled(runtime, response, send, seen)
    elif ex.writer is not None and is_sse:
        # A stream's reads go out from the read callback; a whole body is mostly in hand by
        # now, so the task writes it itself, which costs less than setting up a splice.
        await _relay_spliced(runtime, response, send, seen, ex.writer)
    else:
        await _relay_direct(runtime, response, send, seen, first)


def _answer_whole(
    ex: Exchange, status: int, headers: list[tuple[bytes, bytes]], body: bytes, writer: BodyWriter
) -> None:
    """The response in one piece: the head and the whole body, written together."""
    ex.status = status
    writer.respond(status, headers, body)
    ex.response_started = True
    if body:
        ChunkLog(ex, False).record(body)
    ex.answered = True


async def _relay_spliced(
    runtime: Runtime, response: UpstreamResponse, send: Send, seen: ChunkLog, writer: BodyWriter
) -> None:
    """The body from the upstream read callback to the client's socket (router/proxy/splice.py);
    this task wakes only when it ends."""
    splice = Splice(seen, writer, response, lambda: _lagging(runtime, response, send))
    response.attach(splice)
    try:
        outcome = await splice.outcome
    finally:
        response.detach()
    if outcome == DONE:
        if seen.is_sse and _lagging(runtime, response, send):
            # The whole answer fit in the socket buffers, but the client is far behind it.
            _mark_slow(runtime, seen.ex)
    elif outcome == LAGGING:
        _mark_slow(runtime, seen.ex)
        await _relay_decoupled(runtime, response, send, seen, splice.pending)
    else:
        assert isinstance(outcome, UpstreamError)
        await _end_with_error(outcome, seen.is_sse, send)


async def _relay_direct(
    runtime: Runtime, response: UpstreamResponse, send: Send, seen: ChunkLog, first: bytes = b""
) -> None:
    """`first`: the body's beginning, already taken from the response."""
    # The client's lag is sampled every LAG_CHECK_S; a write that blocked on a full client
    # socket makes the next sample due at once.
    next_check = time.monotonic() + LAG_CHECK_S
    more = True
    record = seen.record
    if first:
        record(first)
        await send({"type": "http.response.body", "body": first, "more_body": True})
    try:
        async for chunk in response:
            now = record(chunk)
            if now >= next_check:
                next_check = now + LAG_CHECK_S
                if _lagging(runtime, response, send):
                    _mark_slow(runtime, seen.ex)
                    await _relay_decoupled(runtime, response, send, seen, chunk)
                    return
            more = not response.at_end
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
            if not more:
                seen.ex.answered = True
    except UpstreamError as err:
        await _end_with_error(err, seen.is_sse, send)
        return
    if more:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        seen.ex.answered = True
    elif seen.is_sse and _lagging(runtime, response, send):
        # The whole answer fit in the socket buffers, but the client is far behind it.
        _mark_slow(runtime, seen.ex)


def _lagging(runtime: Runtime, response: UpstreamResponse, send: Send) -> bool:
    """Bytes not yet delivered to the client: still upstream-side, and already written but
    unacknowledged."""
    probe = unsent_probe(send)
    return runtime.lag.lagging(response.buffered + (probe() if probe is not None else 0))


async def _end_with_error(err: UpstreamError, is_sse: bool, send: Send) -> None:
    if not is_sse:
        # A JSON body cut short cannot be mended; dropping the connection tells the client.
        raise ResponseAborted(str(err)) from err
    await send({"type": "http.response.body", "body": error_event(err), "more_body": False})


def _mark_slow(runtime: Runtime, ex: Exchange) -> None:
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
    try:
        while (data := await buffer.get()) is not None:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        error = buffer.error
        if isinstance(error, UpstreamError):
            await _end_with_error(error, seen.is_sse, send)
            return
        if error is not None:
            raise error
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        seen.ex.answered = True
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
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
