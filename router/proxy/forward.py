"""Sending one admitted request to a backend of its lane's pool and relaying the answer.

The relay writes every upstream read to the client as it arrives (bytes as received, never
re-encoded). A backend may be swapped for another only before the client has seen a byte;
after that a failure ends the stream with an SSE error event. Every counter taken here is given
back in `finally`, whatever ends the request: success, upstream failure, client disconnect."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from router import health
from router.asgi import Send
from router.errors import RouterError, Unavailable, UpstreamConnectError, UpstreamError, error_event
from router.proxy.upstream import UpstreamResponse
from router.runtime import Backend, Lane, Runtime

# Hop-by-hop headers describe one connection, not the response; the router's own server sets
# `date` and frames the body itself.
_DROP_RESPONSE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
        b"date",
        b"server",
    }
)
_NO_BACKEND_RETRY_AFTER_S = 2.0


@dataclass(slots=True)
class Exchange:
    """The per-request state the relay and its caller share."""

    lane: Lane
    target: bytes
    body: bytes
    request_id: bytes
    accept: bytes | None
    affinity: bytes | None
    started: float
    response_headers: list[tuple[bytes, bytes]]
    observe_gap: Callable[[float], None]
    response_started: bool = False
    first_byte_at: float | None = None
    status: int = 0


def upstream_headers(runtime_pool_key: bytes | None, ex: Exchange) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", b"application/json"),
        (b"accept", ex.accept or b"*/*"),
        (b"x-request-id", ex.request_id),
    ]
    if runtime_pool_key:
        headers.append((b"authorization", b"Bearer " + runtime_pool_key))
    return headers


async def forward(runtime: Runtime, ex: Exchange, send: Send) -> None:
    """Open the upstream response (retrying other backends before the first byte), relay it."""
    response, backend = await _open(runtime, ex)
    try:
        await _relay(ex, response, send)
    finally:
        backend.in_flight -= 1
        await response.aclose()


async def _open(runtime: Runtime, ex: Exchange) -> tuple[UpstreamResponse, Backend]:
    pool = ex.lane.pool
    headers = upstream_headers(pool.upstream_key, ex)
    tried: set[Backend] = set()
    last_error: RouterError | None = None
    metrics = runtime.metrics
    while True:
        candidates = pool.routable(frozenset(tried))
        if not candidates:
            raise last_error or Unavailable(
                f"no healthy backend in pool {pool.name!r}", retry_after=_NO_BACKEND_RETRY_AFTER_S
            )
        backend = ex.lane.balancer.pick(candidates, ex.affinity)
        if tried:
            metrics.retries.labels(pool.name).inc()
        tried.add(backend)
        backend.in_flight += 1
        try:
            response = await backend.upstream.request(b"POST", ex.target, headers, ex.body)
        except UpstreamError as err:
            backend.in_flight -= 1
            metrics.upstream_errors.labels(pool.name, backend.name, err.code).inc()
            if isinstance(err, UpstreamConnectError):
                health.note_failure(backend, runtime.config.health, runtime.metrics)
                last_error = err
                continue
            raise
        except BaseException:
            backend.in_flight -= 1
            raise
        if response.status == 503:
            # vLLM's queue limit answers 503 before doing any work: safe to try a sibling.
            metrics.upstream_errors.labels(pool.name, backend.name, "upstream_503").inc()
            backend.in_flight -= 1
            await response.aclose()
            last_error = Unavailable(
                f"pool {pool.name!r}: every backend is at its queue limit",
                code="backend_overloaded",
                retry_after=1,
            )
            continue
        health.note_success(backend)
        return response, backend


async def _relay(ex: Exchange, response: UpstreamResponse, send: Send) -> None:
    ex.status = response.status
    headers = [(k, v) for k, v in response.headers if k.lower() not in _DROP_RESPONSE]
    headers.extend(ex.response_headers)
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    ex.response_started = True
    is_sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
    observe_gap = ex.observe_gap
    monotonic = time.monotonic
    last = 0.0
    more = True
    try:
        async for chunk in response:
            now = monotonic()
            if ex.first_byte_at is None:
                ex.first_byte_at = now
            elif is_sse:
                observe_gap(now - last)
            last = now
            more = not response.at_end
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
    except UpstreamError as err:
        if not is_sse:
            # A JSON body cut short cannot be mended; dropping the connection tells the client.
            raise ResponseAborted(str(err)) from err
        await send({"type": "http.response.body", "body": error_event(err), "more_body": False})
        return
    if more:
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class ResponseAborted(Exception):
    """The response had started when the backend failed and cannot be ended cleanly: the
    server must drop the client connection (the only signal left for a cut-short body)."""
