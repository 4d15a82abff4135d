"""Sending one admitted request to a backend of its lane's pool, up to the response's head
(router/proxy/respond.py relays the rest).

Admission (router.lanes.poolgate) hands out the backend; the request holds its ticket until it ends. A
backend may be swapped for another only while it provably has not started the request
(`UpstreamError.retryable`, or vLLM's 503 from its queue limit): a request once written is never
sent again. Every counter taken here is given back by `finish`, which the caller
(router/proxy/relay.py) runs in its `finally`, whatever ends the request: success, upstream
failure, client disconnect."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from router.balance.prefix_affinity import rendezvous_score
from router.errors import (
    RETRY_AFTER_MAX_S,
    RouterError,
    Unavailable,
    UpstreamAuthFailed,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
)
from router.fleet import health
from router.fleet.adapters import AdapterNeed, candidates_for, serves
from router.fleet.backend import Backend
from router.fleet.pool import Pool
from router.lanes.poolgate import PoolGate
from router.proxy.attempt import Attempt
from router.proxy.upstream_response import UpstreamResponse
from router.state.runtime import Runtime

log: Final = logging.getLogger("lane_router.forward")

# A wrong pool key fails every request: one warning per backend per interval says it.
AUTH_WARNING_EVERY_S: Final = 60.0
# Failures before a response that speak of the backend's health, not of one request.
_SICK: Final = (UpstreamConnectError, UpstreamClosed)


def upstream_fields(pool_key: bytes | None, ex: Attempt) -> tuple[bytes, int]:
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


def finish(ex: Attempt, gate: PoolGate, response: UpstreamResponse | None) -> None:
    """Give back what the exchange holds: its admission at `gate` (the one it was admitted by,
    though a reload may since have given its lane another pool), and the response's connection."""
    gate.finish(ex.ticket)
    if response is not None:
        response.release()


async def _wait_for_room(ex: Attempt, gate: PoolGate) -> Backend:
    began = time.monotonic()
    try:
        return await gate.acquire(ex.ticket)
    finally:
        ex.lane.queue_time.observe(time.monotonic() - began)


def _hold_blind_prefill(ex: Attempt, gate: PoolGate) -> None:
    """A non-streamed response shows no first token: count it as prefilling for the pool's
    estimate of its prefill time, if the pool gives one (else until the response starts)."""
    limits = gate.limits
    hold = limits.blind_hold_s(ex.prompt_tokens)
    if hold is not None and limits.enabled:
        ticket = ex.ticket
        ticket.timer = asyncio.get_running_loop().call_later(hold, gate.end_prefill, ticket)


async def open_response(runtime: Runtime, ex: Attempt, gate: PoolGate) -> UpstreamResponse:
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
        need = ticket.adapter
        if need is not None:
            await place_adapter(runtime, pool, backend, need)
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
                retry_after=backend_retry_after(response.headers),
            )
            continue
        if backend.consecutive_failures:
            health.note_success(backend)
        rec.connected_at = time.monotonic()
        return response


# What a backend at its queue limit that does not say when to come back is taken to mean (vLLM's
# own 503 says nothing): its queue turns over at its decode rate, most of it within a second.
UNSTATED_RETRY_AFTER_S: Final = 1.0


def backend_retry_after(headers: list[tuple[bytes, bytes]]) -> float:
    """The backend's own Retry-After in whole seconds (a count of them; a date is not read),
    within [1 s, a minute]; UNSTATED_RETRY_AFTER_S when it gave none."""
    for name, value in headers:
        if len(name) == 11 and name.lower() == b"retry-after":
            value = value.strip()
            if value.isdigit() and len(value) <= 6:
                return max(1.0, min(float(int(value)), RETRY_AFTER_MAX_S))
    return UNSTATED_RETRY_AFTER_S


async def place_adapter(runtime: Runtime, pool: Pool, backend: Backend, need: AdapterNeed) -> None:
    """Load the request's adapter on its backend first when the profile says where from and the
    backend does not serve it yet (router/fleet/adapterload.py), and count where it went."""
    if need.path is not None and not serves(backend, need):
        await runtime.fleet.adapter_loads.ensure(
            backend, need, key=pool.upstream_key, tls=pool.tls, timeout=pool.config.read_timeout_s
        )
        placement = "loaded"
    else:
        holders = candidates_for(pool.routable(), need)
        first = max(holders, key=lambda b: rendezvous_score(need.key, b.name)) if holders else backend
        placement = "preferred" if first is backend else "spilled"
    runtime.metrics.adapter_requests.labels(pool.name, placement).inc()


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
