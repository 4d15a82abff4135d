"""The request path of a proxied route: key → facts → class → lane → limits → backend → stream.
OpenAI's routes, vLLM's own and Anthropic's Messages API (its body read by
router/request/anthropic.py) take the same path.

What the request brings is read by router/proxy/intake.py; the exchange with the backend, under
the key's rate limits and the disconnect watch, is router/proxy/relay.py."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any

from router.app.asgi import Message, Receive, Send, body_writer
from router.app.routes import ApiRoute
from router.balance import Affinity, AffinityRequest
from router.balance import affinity_for as balance_affinity
from router.errors import NotFound, RouterError
from router.fleet.adapters import AdapterNeed
from router.keys.auth import ApiKey, credentials
from router.keys.ratelimit import estimate_tokens
from router.lanes.admission import outside_lane_shape
from router.lanes.classify import REASON_TEXT, Signals, classify, parse_class_header
from router.lanes.lane import Lane
from router.lanes.poolgate import Ticket
from router.lanes.route import ModelRoute
from router.lanes.slowclient import client_identity
from router.observe.record import RequestRecord
from router.observe.tracecontext import NO_CLIENT_TRACE
from router.proxy import conversation
from router.proxy.adapters import adapter_of, check_served, learned_route
from router.proxy.attempt import Attempt
from router.proxy.chunklog import UsageTail
from router.proxy.exactcount import exact_facts, undecided
from router.proxy.intake import ClientGone, Headers, read_body, request_id
from router.proxy.relay import CLIENT_CLOSED, relay
from router.proxy.respond import ResponseAborted
from router.request.anthropic import parse_messages
from router.request.audiofacts import audio_upstream_body, parse_audio_facts
from router.request.facts import RequestFacts, parse_facts
from router.request.fields import check_fields
from router.request.multipart import Form
from router.request.rewrite import OutputCaps, check_key_output, output_bound, upstream_body, written_output
from router.request.tokens import PromptCounter
from router.state.runtime import Runtime


def seen_slow(
    runtime: Runtime, facts: RequestFacts, headers: Headers, key: ApiKey, client: str | None
) -> Awaitable[bool] | None:
    """Whether this stream's client was seen lagging, here or (with shared state) by another
    replica: the lookup to await, or None when there is nothing to look up (only streams are
    sent to slow_stream, and an empty memory in a process alone holds no one)."""
    memory = runtime.slow_clients
    if not facts.stream or (memory.shared is None and not len(memory)):
        return None
    return memory.recall(client_identity(key.name, headers.client_id, client), time.monotonic())


def affinity_for(
    lane: Lane,
    facts: RequestFacts,
    runtime: Runtime,
    session: bytes | None = None,
    token_ids: Sequence[int] = (),
    salt: str | None = None,
) -> Affinity:
    """What the lane's balance strategy routes this request on (router/balance/): the prompt's
    block chain over the whole message list, the body's `user`, `X-Session-Id`, the profile's
    repeated-prefix length as the default depth, and the prompt's token ids for a strategy that
    places on them (`engine_token_ids`) with the cache salt the engine keys them with; None for
    strategies that route on none."""
    if not lane.settings.affinity:
        return None
    request = AffinityRequest(
        chain=facts.prefix_chain,
        user=facts.user,
        session=session,
        default_min_tokens=runtime.classify_rules.repeated_prefix_tokens,
        token_ids=token_ids,
        salt=salt,
    )
    return balance_affinity(lane.config.balance, request)


def engine_salt(facts: RequestFacts, salt: str | None) -> str | None:
    """The cache salt the upstream body carries: the key's, which replaces the client's, or the
    client's own."""
    if salt is not None:
        return salt
    sent = facts.body.get("cache_salt")
    return sent if isinstance(sent, str) else None


def engine_token_ids(
    counter: PromptCounter, facts: RequestFacts, adapter: AdapterNeed | None
) -> Sequence[int]:
    """The prompt's token ids as its engine will compute them (router/request/promptids.py), or
    none where the router cannot know them — and for a prompt whose cached blocks the engine
    keys with more than its tokens and salt (an adapter's), which no indexed block matches."""
    sent = facts.body.get("cache_salt")
    if adapter is not None or (sent is not None and not isinstance(sent, str)):
        return ()
    if facts.token_ids is not None:
        return facts.token_ids  # the chat template's count encoded them already
    source = counter.ids
    found = source.of(facts.endpoint, facts.body) if source is not None else None
    return () if found is None else found


def handle(
    runtime: Runtime, api: ApiRoute, scope: Message, receive: Receive, send: Send
) -> Coroutine[Any, Any, None]:
    """One request, its record handed to the observers at the end however it ends. A plain
    function returning the coroutine: one frame fewer on every resume."""
    headers = Headers(scope["headers"])
    rec = start_record(runtime, headers, scope)
    return observed(runtime, rec, _handle(runtime, rec, headers, api, scope, receive, send))


def start_record(runtime: Runtime, headers: Headers, scope: Message) -> RequestRecord:
    """The request's record, begun as it arrives (its id and trace context)."""
    observer = runtime.observer
    supplied = headers.request_id
    rid = request_id(supplied, observer.ids) if supplied else observer.ids.fresh()
    trace = headers.client_trace() if headers.trace is not None else NO_CLIENT_TRACE
    return observer.start(rid, scope["path"], trace, time.monotonic())


async def observed(runtime: Runtime, rec: RequestRecord, work: Coroutine[Any, Any, None]) -> None:
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
            # rec.end(rec.status or 500), without the call: most requests end here.
            rec.status = rec.status or 500
            rec.ended = time.monotonic()
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
    authorization = headers.authorization
    if api.anthropic and headers.api_key is not None:
        authorization = credentials(authorization, headers.api_key)
    key = runtime.keys.authenticate(authorization)
    rec.key_name = key.name
    if api.scope not in key.routes:
        key.allow_route(api.scope)
    body = await read_body(receive, runtime.max_body_bytes, headers.content_length)
    rec.bytes_in = len(body)
    form: Form | None = None
    if api.multipart:
        facts, form = parse_audio_facts(api.endpoint, body, headers.content_type, runtime.counter)
    elif api.anthropic:
        facts = parse_messages(api.endpoint, body, runtime.counters)
    else:
        facts = parse_facts(api.endpoint, body, runtime.counters)
    fields = key.fields
    check_fields(api.endpoint, facts.body, fields)
    if fields.max_tokens is not None:
        check_key_output(facts, fields.max_tokens)
    if key.models is not None:
        key.allow_model(facts.model)
    learned = False
    route = runtime.routes.get(facts.model)
    if route is None:
        # An adapter no pool names, which a backend lists with a parent some pool serves.
        route = learned_route(runtime, facts.model)
        if route is None:
            raise NotFound(f"model {facts.model!r} is not served here", code="model_not_found")
        learned = True
    counter = route.counter
    # No tokenizer for this model: where the byte bound leaves a decision open, the backends count.
    # A prompt below every threshold of its model, and within its key's tpm with its output,
    # decides nothing: one comparison or two, and nothing more, for most requests.
    if (
        counter.asks_backend
        and (facts.prompt_tokens >= counter.ask_above or _may_reach_tpm(key, facts))
        and undecided(runtime, route, facts, key)
    ):
        facts = await exact_facts(runtime, route, facts)
    stored = await conversation.previous(runtime, key, facts) if api.endpoint == "responses" else None
    if stored is not None:
        facts = facts.with_prompt_tokens(facts.prompt_tokens + stored.holder.tokens)
    client = scope.get("client")
    address = str(client[0]) if client else None
    # Only streams are sent to slow_stream: nothing to look up for the others.
    lookup = seen_slow(runtime, facts, headers, key, address) if facts.stream else None
    slow = await lookup if lookup is not None else False
    lane, reason = choose_lane(runtime, route, rec, facts, headers, key, slow, stored)
    settings = lane.settings
    # A request naming an adapter goes only to the backends that hold it (router/proxy/adapters.py).
    need = adapter_of(lane, facts.model, learned) if learned or settings.adapters else None
    if need is not None:
        check_served(lane, need)
    caps = OutputCaps(lane=settings.max_output_tokens, key=fields.max_tokens, context=settings.max_model_len)
    bound = output_bound(facts, caps)
    priority = settings.priority if settings.by_priority and api.engine_fields and api.priority else None
    salt = key.cache_salt if api.engine_fields else None
    extra = [(b"x-request-id", rid)]
    if api.anthropic:
        extra.append((b"request-id", rid))  # where Anthropic's clients read it
    if runtime.debug_headers:
        extra += debug_headers(lane, reason, facts.prompt_tokens, bound)
    rm = settings.route_metrics
    if rm is None:
        rm = settings.route_metrics = runtime.metrics.route(lane.cls.value, lane.name, lane.pool.name)
    rec.classified_at = time.monotonic()
    ticket = Ticket(
        lane,
        facts.prompt_tokens > lane.pool.gate.limits.long_prompt_tokens,
        affinity_for(
            lane,
            facts,
            runtime,
            headers.session_id,
            engine_token_ids(counter, facts, need) if settings.token_ids else (),
            engine_salt(facts, salt) if settings.token_ids else None,
        )
        if settings.affinity
        else None,
        stored.backend if stored is not None else None,  # positional: the pin
    )
    ticket.tenant = key.tenant
    ticket.tokens = facts.prompt_tokens + (bound or 0) * facts.sequences
    if need is not None:
        ticket.for_adapter(need)
    if form is not None:
        upstream = audio_upstream_body(body, form, facts, bound)
    else:
        upstream = upstream_body(facts, bound, priority, salt)
    observer = runtime.observer
    # A request neither traced nor bringing a trace context carries none upstream.
    untraced = rec.trace is None and rec.client_trace is NO_CLIENT_TRACE
    trace_headers = () if untraced else observer.upstream_headers(rec)
    ex = Attempt(
        lane=lane,
        target=api.target,
        body=upstream,
        request_id=key.id_prefix + rid,  # upstream_request_id, without the call
        accept=headers.accept,
        ticket=ticket,
        started=rec.started,
        response_headers=extra,
        gaps=rm.itl,
        record=rec,
        stream=facts.stream,
        prompt_tokens=facts.prompt_tokens,
        client=(key.name, headers.client_id, address),
        usage_tail=UsageTail() if observer.wants_usage else None,
        writer=body_writer(scope),
        method=b"POST",
        trace_headers=trace_headers,
    )
    if form is not None and headers.content_type is not None:
        ex.content_type = headers.content_type
    cost = estimate_tokens(facts.prompt_tokens, bound, facts.sequences)
    if api.endpoint == "responses":
        tokens = facts.prompt_tokens + (bound or 0)
        await conversation.relay_turn(runtime, ex, rm, key, cost, facts, tokens, receive, send)
        return
    await relay(runtime, ex, rm, key, cost, receive, send)


def _may_reach_tpm(key: ApiKey, facts: RequestFacts) -> bool:
    """Whether the prompt's bound with its output reaches the key's tpm: only then is the tpm
    a threshold its count could fall on either side of."""
    limits = key.limits
    if limits is None or limits.tpm is None:
        return False
    return facts.prompt_tokens + (facts.output_tokens or 0) >= limits.tpm


def choose_lane(
    runtime: Runtime,
    route: ModelRoute,
    rec: RequestRecord,
    facts: RequestFacts,
    headers: Headers,
    key: ApiKey,
    slow: bool,
    stored: conversation.Stored | None,
) -> tuple[Lane, str]:
    """The request's lane among its model's (`route`) and the reason for its class, checked
    against the key and the lane's pool and shape, counted and recorded. The class is decided
    with the signals the router keeps: repeated prefixes and slow clients."""
    rules = runtime.classify_rules
    seen = 0
    # A prompt shorter than one block has no chain, so no fingerprint to look up.
    if facts.prefix_chain:
        fingerprint = facts.prefix_fingerprint(rules.repeated_prefix_tokens)
        if fingerprint is not None:
            seen = runtime.prefixes.observe(fingerprint, time.monotonic())
    header = headers.request_class
    written: int | None = None
    if not facts.stream and facts.max_tokens is None:
        # Outside batch, a non-streamed request goes to the default class's lane: the bound the
        # router writes there decides whether it is a large generation.
        default = route.lanes[rules.default_class].settings
        caps = OutputCaps(
            lane=default.max_output_tokens, key=key.fields.max_tokens, context=default.max_model_len
        )
        written = written_output(facts, caps)
    signals = Signals(
        header_class=parse_class_header(header) if header else None,
        prefix_seen=seen,
        slow_client=slow,
        output_tokens=written,
    )
    decision = classify(facts, key, signals, rules)
    lane = route.lanes[decision.cls]
    if stored is not None:
        decision, lane = conversation.follow_lane(decision, lane, stored)
    if key.classes is not None:
        key.allow_class(decision.cls)
    reason = REASON_TEXT[decision.reason]
    settings = lane.settings
    counted = settings.classified.get(reason)
    if counted is None:
        counted = settings.classified[reason] = runtime.metrics.classified.labels(lane.cls.value, reason)
    counted.inc()
    rec.cls, rec.reason = lane.cls, reason  # a StrEnum: its name as a str, without the lookup of `.value`
    rec.lane, rec.pool = lane.name, lane.pool.name
    rec.stream = facts.stream
    if facts.model not in settings.models and facts.model not in runtime.fleet.learned_adapters:
        raise NotFound(
            f"model {facts.model!r} is not served by pool {lane.pool.name!r} of lane {lane.name!r}",
            code="model_not_found",
        )
    # A lane without a request shape refuses none.
    if settings.shaped:
        refused = outside_lane_shape(lane.name, lane.config, facts.prompt_tokens, facts.output_tokens)
        if refused is not None:
            raise refused
    return lane, reason


def debug_headers(
    lane: Lane, reason: str, prompt_tokens: int, bound: int | None
) -> list[tuple[bytes, bytes]]:
    """What the router decided, for the client to see when the profile asks for it."""
    out = [
        (b"x-lane-router-class", lane.cls.value.encode()),
        (b"x-lane-router-lane", lane.name.encode()),
        (b"x-lane-router-reason", reason.encode()),
        (b"x-lane-router-prompt-tokens", b"%d" % prompt_tokens),
    ]
    if bound is not None:
        out.append((b"x-lane-router-max-tokens", b"%d" % bound))
    return out
