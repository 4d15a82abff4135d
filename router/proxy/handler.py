"""The request path of a proxied OpenAI route: key → facts → class → lane → limits → backend → stream.

While the request waits for or relays its response, a watcher listens for the client going
away; when it does, the request task is cancelled at once, which closes the upstream connection
(vLLM then aborts the request and frees its KV blocks)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from dataclasses import replace

from router.admission import outside_lane_shape
from router.apiroutes import ApiRoute
from router.asgi import Message, Receive, Send, body_writer
from router.audiofacts import audio_upstream_body, parse_audio_facts
from router.auth import ApiKey
from router.balance import Affinity, AffinityRequest, routes_on_affinity
from router.balance import affinity_for as balance_affinity
from router.classify import Classification, Signals, classify, parse_class_header
from router.errors import BadRequest, NotFound, PayloadTooLarge, RouterError, Unavailable
from router.facts import RequestFacts, parse_facts
from router.metrics import RouteMetrics
from router.multipart import Form
from router.poolgate import Ticket
from router.proxy import conversation
from router.proxy.chunklog import UsageTail
from router.proxy.forward import Exchange, ResponseAborted, forward
from router.ratelimit import Limits, estimate_tokens, parse_usage, rate_headers, refusal
from router.requestfields import check_fields
from router.requestrecord import RequestRecord
from router.rewrite import OutputCaps, check_key_output, output_bound, upstream_body
from router.runtime import Lane, Runtime
from router.slowclient import client_identity
from router.tracecontext import NO_CLIENT_TRACE, ClientTrace, client_trace

WATCH_AFTER_S = 0.02
# The status an access log gives a request whose client left before any response (as nginx does).
CLIENT_CLOSED = 499


class ClientGone(Exception):
    """The client disconnected; nothing more is to be sent."""


# Headers that decide who a request is and where it goes: a second copy is refused, since
# proxies in front of the router and the router itself could each read a different one.
_SINGLE = frozenset({b"authorization", b"x-request-class", b"x-client-id", b"x-session-id"})


class Headers:
    """The few request headers the router reads, found in one pass."""

    __slots__ = (
        "accept",
        "authorization",
        "client_id",
        "content_length",
        "content_type",
        "request_class",
        "request_id",
        "session_id",
        "trace",
    )

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.authorization: bytes | None = None
        self.content_length: bytes | None = None
        self.content_type: bytes | None = None
        self.request_id: bytes | None = None
        self.request_class: bytes | None = None
        self.accept: bytes | None = None
        self.session_id: bytes | None = None
        self.client_id: bytes | None = None
        self.trace: list[tuple[bytes, bytes]] | None = None  # traceparent and tracestate lines
        seen: set[bytes] = set()
        for name, value in raw:
            n = name.lower()
            if n in _SINGLE:
                if n in seen:
                    raise BadRequest(f"more than one {n.decode()} header", code="duplicate_header")
                seen.add(n)
            if n == b"authorization":
                self.authorization = value
            elif n == b"content-length":
                self.content_length = value
            elif n == b"content-type":
                self.content_type = value
            elif n == b"x-request-id":
                self.request_id = value
            elif n == b"x-request-class":
                self.request_class = value
            elif n == b"accept":
                self.accept = value
            elif n == b"x-session-id":
                self.session_id = value
            elif n == b"x-client-id":
                self.client_id = value
            elif n == b"traceparent" or n == b"tracestate":
                if self.trace is None:
                    self.trace = []
                self.trace.append((n, value))

    def client_trace(self) -> ClientTrace:
        if self.trace is None:
            return NO_CLIENT_TRACE
        parents = [v for n, v in self.trace if n == b"traceparent"]
        return client_trace(parents, [v for n, v in self.trace if n == b"tracestate"])


def request_id(supplied: bytes | None) -> bytes:
    """The client's X-Request-Id when it is a plain visible-ASCII token, else a fresh one."""
    if supplied and len(supplied) <= 128 and all(33 <= ch <= 126 for ch in supplied):
        return supplied
    return os.urandom(12).hex().encode()


def upstream_request_id(key: ApiKey, rid: bytes) -> bytes:
    """The id vLLM sees, under the key's name: vLLM names the request after it, and two
    tenants choosing the same id must not meet there. Key names cannot contain ':'."""
    return key.name.encode() + b":" + rid


async def read_body(receive: Receive, limit: int, declared: bytes | None) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is larger than {limit} bytes")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body"):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def route(
    runtime: Runtime, facts: RequestFacts, headers: Headers, key: ApiKey, slow: bool = False
) -> Classification:
    """Classify with the signals the router keeps: repeated prefixes and slow clients."""
    cfg = runtime.config.classify
    seen = 0
    fingerprint = facts.prefix_fingerprint(cfg.repeated_prefix.min_tokens)
    if fingerprint is not None:
        seen = runtime.prefixes.observe(fingerprint, time.monotonic())
    signals = Signals(
        header_class=parse_class_header(headers.request_class), prefix_seen=seen, slow_client=slow
    )
    return classify(facts, key, signals, cfg)


async def seen_slow(
    runtime: Runtime, facts: RequestFacts, headers: Headers, key: ApiKey, client: str | None
) -> bool:
    """Whether this stream's client was seen lagging, here or (with shared state) by another
    replica. Only streams are sent to slow_stream, so nothing else is looked up."""
    memory = runtime.slow_clients
    if not facts.stream or (memory.shared is None and not len(memory)):
        return False
    return await memory.recall(client_identity(key.name, headers.client_id, client), time.monotonic())


def affinity_for(lane: Lane, facts: RequestFacts, runtime: Runtime, session: bytes | None = None) -> Affinity:
    """What the lane's balance strategy routes this request on (router/balance/): the prompt's
    block chain over the whole message list, the body's `user`, `X-Session-Id`, and the
    profile's repeated-prefix length as the default depth; None for strategies that route on none."""
    if not routes_on_affinity(lane.config.balance):
        return None
    request = AffinityRequest(
        chain=facts.prefix_chain,
        user=facts.user,
        session=session,
        default_min_tokens=runtime.config.classify.repeated_prefix.min_tokens,
    )
    return balance_affinity(lane.config.balance, request)


def _client_address(scope: Message) -> str | None:
    client = scope.get("client")
    return str(client[0]) if client else None


async def handle(runtime: Runtime, api: ApiRoute, scope: Message, receive: Receive, send: Send) -> None:
    """One request, its record handed to the observers at the end however it ends."""
    headers = Headers(scope["headers"])
    rec = start_record(runtime, headers, scope)
    await observed(runtime, rec, _handle(runtime, rec, headers, api, scope, receive, send))


def start_record(runtime: Runtime, headers: Headers, scope: Message) -> RequestRecord:
    """The request's record, begun as it arrives (its id and trace context)."""
    rid = request_id(headers.request_id)
    return runtime.observer.start(rid, scope["path"], headers.client_trace(), time.monotonic())


async def observed(runtime: Runtime, rec: RequestRecord, work: Awaitable[None]) -> None:
    """Run `work` (the request), then hand its record to the observers however it ended."""
    observer = runtime.observer
    try:
        await work
    except RouterError as err:
        rec.error_code = err.code
        rec.end(err.status)
        raise
    except ClientGone:
        rec.client_disconnect = True
        rec.end(CLIENT_CLOSED)
        raise
    except ResponseAborted:
        rec.error_code = "response_aborted"
        rec.end(rec.status or 502)
        raise
    finally:
        if rec.ended is None:
            rec.end(rec.status or 500)
        observer.finish(rec)


async def _handle(
    runtime: Runtime,
    rec: RequestRecord,
    headers: Headers,
    api: ApiRoute,
    scope: Message,
    receive: Receive,
    send: Send,
) -> None:
    rid = rec.request_id
    started = rec.started
    key = runtime.keys.authenticate(headers.authorization)
    rec.key_name = key.name
    key.allow_route(api.scope)
    body = await read_body(receive, runtime.config.max_body_bytes, headers.content_length)
    rec.bytes_in = len(body)
    form: Form | None = None
    if api.multipart:
        facts, form = parse_audio_facts(api.endpoint, body, headers.content_type, runtime.counter)
    else:
        facts = parse_facts(api.endpoint, body, runtime.counter)
    check_fields(api.endpoint, facts.body, key.fields)
    check_key_output(facts, key.fields.max_tokens)
    key.allow_model(facts.model)
    if facts.model not in runtime.models:
        raise NotFound(f"model {facts.model!r} is not served here", code="model_not_found")
    stored = await conversation.previous(runtime, key, facts) if api.endpoint == "responses" else None
    if stored is not None:
        facts = replace(facts, prompt_tokens=facts.prompt_tokens + stored.holder.tokens)
    address = _client_address(scope)
    slow = await seen_slow(runtime, facts, headers, key, address)
    decision = route(runtime, facts, headers, key, slow)
    lane = runtime.lanes[decision.cls]
    if stored is not None:
        decision, lane = conversation.follow_lane(decision, lane, stored)
    key.allow_class(decision.cls)
    runtime.metrics.classified_child(decision.cls.value, decision.reason.value).inc()
    rec.cls, rec.reason = decision.cls.value, decision.reason.value
    rec.lane, rec.pool = lane.name, lane.pool.name
    rec.stream = facts.stream
    if facts.model not in lane.pool.config.models:
        raise NotFound(
            f"model {facts.model!r} is not served by pool {lane.pool.name!r} of lane {lane.name!r}",
            code="model_not_found",
        )
    refused = outside_lane_shape(lane.name, lane.config, facts.prompt_tokens, facts.output_tokens)
    if refused is not None:
        raise refused
    pool_cfg = lane.pool.config
    bound = output_bound(
        facts, OutputCaps(lane.config.max_output_tokens, key.fields.max_tokens, pool_cfg.vllm.max_model_len)
    )
    by_priority = pool_cfg.vllm.scheduling_policy == "priority" and api.engine_fields
    priority = lane.config.priority if by_priority else None
    extra = [(b"x-request-id", rid)]
    if runtime.config.debug_headers:
        extra += [
            (b"x-lane-router-class", decision.cls.value.encode()),
            (b"x-lane-router-lane", lane.name.encode()),
            (b"x-lane-router-reason", decision.reason.value.encode()),
            (b"x-lane-router-prompt-tokens", b"%d" % facts.prompt_tokens),
        ]
        if bound is not None:
            extra.append((b"x-lane-router-max-tokens", b"%d" % bound))
    rm = runtime.metrics.route(decision.cls.value, lane.name, lane.pool.name)
    rec.classified_at = time.monotonic()
    ticket = Ticket(
        lane=lane,
        long=facts.prompt_tokens > lane.pool.gate.limits.long_prompt_tokens,
        affinity=affinity_for(lane, facts, runtime, headers.session_id),
        pin=stored.backend if stored is not None else None,
    )
    if form is not None:
        upstream = audio_upstream_body(body, form, facts, bound)
    else:
        upstream = upstream_body(facts, bound, priority, key.cache_salt if api.engine_fields else None)
    ex = Exchange(
        lane=lane,
        target=api.target,
        body=upstream,
        request_id=upstream_request_id(key, rid),
        accept=headers.accept,
        ticket=ticket,
        started=started,
        response_headers=extra,
        observe_gap=rm.itl.observe,
        record=rec,
        stream=facts.stream,
        prompt_tokens=facts.prompt_tokens,
        client=(key.name, headers.client_id, address),
        trace_headers=runtime.observer.upstream_headers(rec),
        writer=body_writer(scope),
    )
    if runtime.observer.wants_usage:
        ex.usage_tail = UsageTail()
    if form is not None and headers.content_type is not None:
        ex.content_type = headers.content_type
    if api.endpoint == "responses":
        ex.on_chunk = conversation.capture(
            runtime, key, lane, facts.prompt_tokens + (bound or 0), lambda: ticket.backend, lambda: ex.status
        )
    await relay(
        runtime, ex, rm, key, estimate_tokens(facts.prompt_tokens, bound, facts.sequences), receive, send
    )


async def relay(
    runtime: Runtime, ex: Exchange, rm: RouteMetrics, key: ApiKey, cost: int, receive: Receive, send: Send
) -> None:
    """Run the exchange under the key's rate limits (if it has any), watching for the client
    going away."""
    if key.rpm is None and key.tpm is None and key.max_concurrency is None:
        await _run_watched(runtime, ex, rm, receive, send)
        return
    await _run_limited(runtime, ex, rm, key, cost, receive, send)


async def _run_limited(
    runtime: Runtime,
    ex: Exchange,
    rm: RouteMetrics,
    key: ApiKey,
    cost: int,
    receive: Receive,
    send: Send,
) -> None:
    """The key's rate limits around the request: refused before anything is taken; charged its
    upper bound, corrected by the response's usage; refunded when the router served nothing."""
    limits = Limits(key.rpm, key.tpm, key.max_concurrency)
    charged = cost if key.tpm is not None else 0
    store = runtime.rates
    verdict = await store.acquire(key.name, limits, charged, time.monotonic())
    if not verdict.allowed:
        raise refusal(verdict)
    if not verdict.recorded:
        # The shared store was unavailable and let the request through uncounted.
        await _run_watched(runtime, ex, rm, receive, send)
        return
    ex.response_headers.extend(rate_headers(verdict))
    if key.tpm is not None:
        ex.usage_tail = UsageTail()
    refund = False
    try:
        await _run_watched(runtime, ex, rm, receive, send)
    except Unavailable:
        refund = not ex.response_started
        raise
    finally:
        now = time.monotonic()
        if refund:
            await store.refund(key.name, limits, charged, now)
        else:
            used = parse_usage(ex.usage_tail.value()) if ex.usage_tail is not None else None
            await store.settle(key.name, limits, charged, used, now)


async def _run_watched(
    runtime: Runtime, ex: Exchange, rm: RouteMetrics, receive: Receive, send: Send
) -> None:
    task = asyncio.current_task()
    assert task is not None
    gone = False
    finished = False

    def on_disconnect(_: asyncio.Future[None]) -> None:
        nonlocal gone
        if not finished and not ex.answered:
            gone = True
            task.cancel()

    watcher: asyncio.Task[None] | None = None

    def watch() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        watcher.add_done_callback(on_disconnect)

    # Most requests end before a watcher task would pay off; one starts only if this one runs
    # longer than WATCH_AFTER_S, which bounds how late a disconnect can be noticed.
    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch)
    rm.in_flight.inc()
    status = "error"
    try:
        await forward(runtime, ex, send)
        status = str(ex.status)
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        status = "client_disconnect"
        phase = "stream" if ex.first_byte_at is not None else "before_first_byte"
        rm.disconnected(phase)
    except RouterError as err:
        status = str(err.status)
        raise
    finally:
        finished = True
        timer.cancel()
        if watcher is not None:
            watcher.remove_done_callback(on_disconnect)
            watcher.cancel()
        rm.in_flight.dec()
        _observe(ex, rm, status)
        _record(ex, gone)


def _record(ex: Exchange, gone: bool) -> None:
    """What the relay learned, into the request's record; the status is the one the client got
    (or, gone before a response, nginx's 499)."""
    rec = ex.record
    rec.first_byte_at = ex.first_byte_at
    rec.bytes_out = ex.bytes_out
    tail = ex.usage_tail.value() if ex.usage_tail is not None else b""
    if tail:
        rec.usage_tail = tail
    if ex.response_started:
        rec.status = ex.status
    if gone:
        rec.client_disconnect = True
        rec.end(ex.status if ex.response_started else CLIENT_CLOSED)


def _observe(ex: Exchange, rm: RouteMetrics, status: str) -> None:
    rm.request_done(status)
    if ex.first_byte_at is not None:
        rm.ttft.observe(ex.first_byte_at - ex.started)
        rm.duration.observe(time.monotonic() - ex.started)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
