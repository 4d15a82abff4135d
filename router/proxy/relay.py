"""A decided request's exchange with its backend, under the key's rate limits, watching for the
client going away (router/proxy/watch.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Final

from router.app.asgi import Receive, Send
from router.app.routes import ANTHROPIC_TARGETS
from router.errors import RouterError, Unavailable, UpstreamError
from router.keys.auth import ApiKey
from router.keys.rateheaders import KeyRates, refusal
from router.keys.ratelimit import Limits, MemoryRateStore, RateStore, Verdict, believed, parse_usage
from router.observe.metrics import RouteMetrics
from router.observe.slo import judge
from router.proxy.attempt import Attempt
from router.proxy.chunklog import UsageTail
from router.proxy.forward import finish, open_response
from router.proxy.respond import relay_response
from router.proxy.upstream_response import UpstreamResponse
from router.state.runtime import Runtime

# The status an access log gives a request whose client left before any response (as nginx does).
CLIENT_CLOSED: Final = 499


class Charge:
    """A request's charge on its key's rate limits, settled (or refunded) when it ends. `local`
    is the in-process store, called directly since its work never waits; a shared store is
    awaited. A compiled class: one C call compiled."""

    __slots__ = ("key", "limits", "local", "rates", "store", "tokens")

    def __init__(
        self, *, store: RateStore, local: MemoryRateStore | None, key: str, rates: KeyRates, tokens: int
    ) -> None:
        self.store: Final = store
        self.local: Final = local
        self.key: Final = key
        self.rates: Final = rates
        self.limits: Final[Limits] = rates.limits
        self.tokens: Final = tokens


def relay(
    runtime: Runtime, ex: Attempt, rm: RouteMetrics, key: ApiKey, cost: int, receive: Receive, send: Send
) -> Coroutine[Any, Any, None]:
    """Run the exchange under the key's rate limits (if it has any): refused before anything is
    taken; charged its upper bound, corrected by the response's usage; refunded when the router
    served nothing. A plain function returning the coroutine: one frame fewer on every resume."""
    rates = key.rates
    if rates is None:
        return _exchange(runtime, ex, rm, receive, send, None)
    limits = rates.limits
    store = runtime.rates
    local = store if isinstance(store, MemoryRateStore) else None
    tokens = cost if limits.tpm is not None else 0
    charge = Charge(store=store, local=local, key=key.name, rates=rates, tokens=tokens)
    if local is None:
        return _shared(runtime, ex, rm, receive, send, charge)
    verdict = local.take(key.name, limits, tokens, time.monotonic())
    return _exchange(runtime, ex, rm, receive, send, _admitted(ex, verdict, charge))


async def _shared(
    runtime: Runtime, ex: Attempt, rm: RouteMetrics, receive: Receive, send: Send, charge: Charge
) -> None:
    verdict = await charge.store.acquire(charge.key, charge.limits, charge.tokens, time.monotonic())
    await _exchange(runtime, ex, rm, receive, send, _admitted(ex, verdict, charge))


def _admitted(ex: Attempt, verdict: Verdict, charge: Charge) -> Charge | None:
    """The charge to settle, or None when a shared store that could not be reached let the
    request through uncounted; a refused request raises."""
    if not verdict.allowed:
        raise refusal(verdict, charge.rates, ex.target in ANTHROPIC_TARGETS)
    if not verdict.recorded:
        return None
    levels = verdict.levels
    if levels is None:
        pass
    elif ex.target in ANTHROPIC_TARGETS:
        charge.rates.anthropic(ex.response_headers, levels, time.time())
    else:
        charge.rates.openai(ex.response_headers, levels)
    if charge.limits.tpm is not None:
        ex.usage_tail = UsageTail()
    return charge


async def _settle_shared(charge: Charge, used: int | None, served: bool, now: float) -> None:
    if served:
        await charge.store.settle(charge.key, charge.limits, charge.tokens, used, now)
    else:
        await charge.store.refund(charge.key, charge.limits, charge.tokens, now)


async def _exchange(
    runtime: Runtime, ex: Attempt, rm: RouteMetrics, receive: Receive, send: Send, charge: Charge | None
) -> None:
    watchlist = runtime.watchlist
    watch = watchlist.watch(ex, receive, ex.writer)
    rm.in_flight.inc()
    status: int | str = "error"
    served = True
    response: UpstreamResponse | None = None
    gate = ex.lane.pool.gate
    # A shared store's settlement, awaited once the rest is done: not in `finally`, where a
    # compiled await re-raises an exception a caller is handling (docs/compiled.md).
    settle: tuple[Charge, int | None, bool, float] | None = None
    try:
        try:
            # Opened and relayed here, not in a coroutine of their own: one frame fewer on every resume.
            response = await open_response(runtime, ex, gate)
            await relay_response(runtime, ex, response, send)
            status = ex.status
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            watch.uncancel()
            status = "client_disconnect"
            rm.disconnected("stream" if ex.first_byte_at is not None else "before_first_byte")
        except RouterError as err:
            status = err.status
            served = ex.response_started or not isinstance(err, Unavailable)
            if response is not None and isinstance(err, UpstreamError):
                # The backend failed mid-body, before the client got a byte: a failed attempt.
                _count_failure(runtime, ex, err)
            raise
        finally:
            finish(ex, gate, response)
            watchlist.drop(watch)
            rm.in_flight.dec()
            now = time.monotonic()
            tail = _ended(ex, rm, status, watch.gone, now)
            if charge is not None:
                pace = charge.rates.pace
                if pace is not None:
                    pace.ended(now - ex.started)  # how long a key's slot is held
                # The tokens the response reported using (None if unknown, or if nothing was served).
                used = believed(parse_usage(tail), charge.tokens, charge.limits) if served else None
                local = charge.local
                if local is not None:
                    # The in-process store: settled here, without a coroutine.
                    local.release(charge.key, charge.limits, charge.tokens, used, now, served)
                else:
                    settle = (charge, used, served, now)
    except BaseException as exc:
        if settle is not None:
            await _settle_shared(*settle)
        raise exc  # named, not bare: docs/compiled.md
    if settle is not None:
        await _settle_shared(*settle)


def _count_failure(runtime: Runtime, ex: Attempt, err: UpstreamError) -> None:
    backend = ex.ticket.backend
    if backend is not None:
        runtime.metrics.upstream_errors.labels(backend.pool, backend.name, err.code).inc()


def _ended(ex: Attempt, rm: RouteMetrics, status: int | str, gone: bool, now: float) -> bytes:
    """The exchange's metrics, and what the relay learned into the request's record: the status
    there is the one the client got (or, gone before a response, nginx's 499). Returns the
    response's tail, b"" if not kept."""
    rm.request_done(status)
    rec = ex.record
    started = ex.started
    first_byte_at = ex.first_byte_at
    ttft: float | None = None
    if first_byte_at is not None:
        ttft = first_byte_at - started
        rm.ttft.observe(ttft)
        rm.duration.observe(now - started)
    slo = ex.lane.settings.slo
    if slo is not None:
        # Judged from the times just observed: no clock read of its own.
        rec.slo = verdict = judge(slo, status, gone, ttft, now - started, ex.gaps_timed, ex.gaps_late)
        rm.slo_judged(verdict)
    rec.first_byte_at = first_byte_at
    rec.bytes_out = ex.bytes_out
    tail = ex.usage_tail.value(ex.bytes_out) if ex.usage_tail is not None else b""
    if tail:
        rec.usage_tail = tail
    if ex.response_started:
        rec.status = ex.status
    if gone:
        rec.client_disconnect = True
        rec.end(ex.status if ex.response_started else CLIENT_CLOSED)
    return tail
