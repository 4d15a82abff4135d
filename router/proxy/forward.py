"""Sending one admitted request to a backend of its lane's pool, up to the response's head
(router/proxy/respond.py relays the rest).

Admission (router.poolgate) hands out the backend; the request holds its ticket until it ends. A
backend may be swapped for another only while it provably has not started the request
(`UpstreamError.retryable`, or vLLM's 503 from its queue limit): a request once written is never
sent again. Every counter taken here is given back by `finish`, which the caller
(router/proxy/relay.py) runs in its `finally`, whatever ends the request: success, upstream
failure, client disconnect."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

from router import health
from router.asgi import BodyWriter
from router.errors import (
    RouterError,
    Unavailable,
    UpstreamAuthFailed,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
)
from router.leanmetrics import HistogramValue
from router.poolgate import PoolGate, Ticket
from router.proxy.chunklog import UsageTail
from router.proxy.upstream_response import UpstreamResponse
from router.requestrecord import RequestRecord
from router.runtime import Backend, Lane, Runtime

log: Final = logging.getLogger("lane_router.forward")

# A wrong pool key fails every request: one warning per backend per interval says it.
AUTH_WARNING_EVERY_S: Final = 60.0
# Failures before a response that speak of the backend's health, not of one request.
_SICK: Final = (UpstreamConnectError, UpstreamClosed)


class Exchange:
    """The per-request state the relay and its caller share. A plain slotted class, not a
    dataclass: one is built per request, so `__init__` takes what the caller knows (by keyword:
    mypyc places keywords at compile time) and sets the relay's own state from constants."""

    __slots__ = (
        "accept",
        "answered",
        "body",
        "bytes_out",
        "client",
        "content_type",
        "first_byte_at",
        "gaps",
        "lane",
        "method",
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
        *,
        lane: Lane,
        target: bytes,
        body: bytes,
        request_id: bytes,
        accept: bytes | None,
        ticket: Ticket,
        started: float,
        response_headers: list[tuple[bytes, bytes]],
        gaps: HistogramValue,
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
        self.gaps = gaps  # the stream's token gaps (its route's inter-token latency)
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
        self.bytes_out = 0  # the response's body bytes, set when its relay ends (router/proxy/respond.py)
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
