"""Responses-API conversations on the backend that holds them (router.state.responseids).

A request with `previous_response_id` continues a conversation vLLM keeps in one server's
memory: it goes to that backend only (its ticket is pinned), through a lane whose pool holds it,
and its prompt bound includes the stored conversation's tokens — what the backend reported for
the previous turn (its usage's input plus output tokens, and the template's tokens around that
output), or, when it reported none, that turn's prompt and output bounds. An id this key did not
create, one the router no longer remembers, or one whose backend left its pool is answered with
the same 404, so no key learns anything about another's responses. A relayed response's id is
read from its first bytes (the JSON body's `id`, or the `response.created` event's) and bound
the moment it passes, so a cancel can reach a response still streaming; a binding never moves an
id from its first owner.

vLLM names a response after the body's `request_id` when there is one (never after the
`X-Request-Id` header, which the router sends as `<key>:<id>` anyway): such a request claims its
id before anything goes out, and an id the router knows, or a backend of the pool still holds
(router/proxy/backendids.py), is refused with 409."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Final

from router.app.asgi import Receive, Send
from router.app.routes import RESPONSE_ID
from router.errors import BadRequest, Conflict, NotFound, Unavailable
from router.fleet.backend import Backend
from router.keys.auth import ApiKey
from router.keys.ratelimit import usage_at
from router.lanes.classify import Classification, Reason
from router.lanes.lane import Lane
from router.observe.metrics import RouteMetrics
from router.proxy.attempt import Attempt
from router.proxy.backendids import Held, held_upstream
from router.proxy.chunklog import UsageTail
from router.proxy.relay import relay
from router.request.facts import RequestFacts
from router.request.tokens import NO_MEDIA
from router.state.responseids import Holder
from router.state.runtime import Runtime
from router.state.shared import SharedStateDown

# A response's id is its first `"id"` (the body's own, or the response.created event's, whose
# response object begins with it); past this many bytes without one, nothing is remembered.
HEAD_LIMIT: Final = 64 * 1024
_FIRST_ID: Final = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,128})"')


def not_found(response_id: str) -> NotFound:
    return NotFound(f"response {response_id!r} not found", code="response_not_found")


@dataclass(frozen=True, slots=True)
class Stored:
    """A remembered response, and the backend and lane it is to be reached through."""

    holder: Holder
    backend: Backend
    lane: Lane


async def find(runtime: Runtime, key: ApiKey, response_id: str) -> Stored:
    """The stored response `response_id` of this key, or the 404 every other case gets."""
    holder = await runtime.responses.recall(response_id, key.name)
    if holder is None or holder.pending:
        raise not_found(response_id)
    pool = runtime.pools.get(holder.pool)
    backend = next((b for b in pool.members if b.name == holder.backend), None) if pool else None
    lane = _lane_on(runtime, holder)
    if backend is None or lane is None:
        raise not_found(response_id)
    return Stored(holder, backend, lane)


def _lane_on(runtime: Runtime, holder: Holder) -> Lane | None:
    """The lane of the response's class (of the model of the response's pool) if it still sends
    to the response's pool, else any lane that does."""
    pool = runtime.pools.get(holder.pool)
    route = runtime.routes.get(pool.config.model) if pool is not None else None
    lane = route.lanes.get(holder.cls) if route is not None else None
    if lane is not None and lane.pool.name == holder.pool:
        return lane
    return next((ln for ln in runtime.lanes.values() if ln.pool.name == holder.pool), None)


async def previous(runtime: Runtime, key: ApiKey, facts: RequestFacts) -> Stored | None:
    """The conversation a Responses request continues, if it names one."""
    if facts.endpoint != "responses":
        return None
    value = facts.body.get("previous_response_id")
    if value is None:
        return None
    if not isinstance(value, str) or not RESPONSE_ID.fullmatch(value.encode()):
        raise BadRequest("'previous_response_id' is not a response id", code="invalid_previous_response_id")
    return await find(runtime, key, value)


def follow_lane(decision: Classification, lane: Lane, stored: Stored) -> tuple[Classification, Lane]:
    """The class's own lane when its pool holds the conversation, else the conversation's."""
    if lane.pool is stored.lane.pool:
        return decision, lane
    return Classification(stored.lane.cls, Reason.CONVERSATION), stored.lane


class Turn:
    """One Responses request's response id: claimed before the request goes out when the client
    names it (`request_id`), read from the response's first bytes and bound to the backend that
    answered the moment it passes (so a cancel can reach a response still streaming), and, when
    the response has ended, its binding told the conversation's tokens as the backend counted
    them. A claim no response was bound to is given back."""

    __slots__ = ("_bound", "_claim", "_ex", "_head", "_key", "_lane", "_reply", "_responses", "_tokens")

    def __init__(
        self,
        runtime: Runtime,
        key: ApiKey,
        lane: Lane,
        tokens: int,
        claim: Claim | None,
        ex: Attempt,
    ) -> None:
        self._responses = runtime.responses
        # What the template adds around this turn's output when a follow-up renders it again as
        # an assistant message: the backend's usage does not count it.
        self._reply = runtime.counter.message("assistant", "", "", NO_MEDIA)
        self._key = key
        self._lane = lane
        self._tokens = tokens  # the turn's prompt and output bounds: the conversation's until usage is known
        self._claim = claim
        self._ex = ex
        self._head: bytearray | None = bytearray()
        self._bound: tuple[str, Holder] | None = None

    def __call__(self, chunk: bytes) -> None:
        head = self._head
        if head is None:
            return
        head += chunk
        found = _FIRST_ID.search(head)
        if found is not None:
            self._head = None
            self._on_id(found[1].decode("ascii"))
        elif len(head) > HEAD_LIMIT:
            self._head = None

    def _replaces(self, response_id: str) -> tuple[Holder, ...]:
        claim = self._claim
        return (claim.holder,) if claim is not None and claim.response_id == response_id else ()

    def _on_id(self, response_id: str) -> None:
        ex = self._ex
        served = ex.ticket.backend
        if ex.status != 200 or served is None:
            return
        holder = Holder(
            key=self._key.name, pool=served.pool, backend=served.name, cls=self._lane.cls, tokens=self._tokens
        )
        if self._responses.bind(response_id, holder, self._replaces(response_id)):
            self._bound = response_id, holder

    def ended(self, tail: bytes | None) -> None:
        """The exchange is over: the binding learns the conversation's tokens from the response's
        usage (kept at the turn's bounds when the response reported none); an unused claim is
        released."""
        bound, claim = self._bound, self._claim
        if claim is not None and (bound is None or bound[0] != claim.response_id):
            self._responses.release(claim.response_id, claim.holder)
        if bound is None:
            return
        used = conversation_tokens(tail) if tail else None
        if used is None:
            return
        response_id, holder = bound
        counted = replace(holder, tokens=used + self._reply)
        self._responses.bind(response_id, counted, (holder, *self._replaces(response_id)))


# A count is a plain integer of at most 12 digits; anything else after the colon (an exponent, a
# fraction, a longer number) is no count, so that no prefix of a larger one is taken for it.
_USAGE_COUNTS: Final = re.compile(
    rb'"(input_tokens|output_tokens)"\s*:\s*(?:(\d{1,12})(?![0-9.eE])|-?[0-9."])'
)


def conversation_tokens(tail: bytes) -> int | None:
    """The tokens of the conversation through this response, as the backend counted them: its
    last usage report's input tokens (the whole conversation vLLM rendered) plus its output
    tokens; None without one."""
    at = usage_at(tail)
    if at < 0:
        return None
    counts: dict[bytes, int | None] = {}
    for found in _USAGE_COUNTS.finditer(tail, at):
        counts.setdefault(found[1], int(found[2]) if found[2] is not None else None)
    inputs, outputs = counts.get(b"input_tokens"), counts.get(b"output_tokens")
    if inputs is None or outputs is None:
        return None
    return inputs + outputs


@dataclass(frozen=True, slots=True)
class Claim:
    """A response id the client named (`request_id`), taken for it before the request went out."""

    response_id: str
    holder: Holder


async def claim_stated(runtime: Runtime, key: ApiKey, facts: RequestFacts, lane: Lane) -> Claim | None:
    """The id this request names for its response, claimed for its key; refused when the router
    knows it (another key's, or this key's own: vLLM would replace the response it names)."""
    value = facts.body.get("request_id")
    if value is None:
        return None
    if not isinstance(value, str) or not RESPONSE_ID.fullmatch(value.encode()):
        raise BadRequest(
            "'request_id' of a response must be 'resp_' and up to 128 letters, digits, '_' or '-'",
            code="invalid_request_id",
        )
    ids = runtime.responses
    if ids.shared is None and not runtime.counting.share.alone:
        # Each process knows only its own ids: another could hold this one for another key.
        raise BadRequest(
            "'request_id' cannot name a response here: several router processes serve this profile "
            "without shared state (state:) to check it against",
            code="request_id_unsupported",
        )
    claim = Claim(value, Holder(key=key.name, pool=lane.pool.name, backend="", cls=lane.cls, tokens=0))
    try:
        taken = not await ids.claim(value, claim.holder)
    except SharedStateDown:
        # Unchecked, the id could be another replica's: refused, as the rate limits' `closed`.
        wait = ids.shared.retry_after_s() if ids.shared is not None else 1.0
        raise Unavailable(
            "response ids cannot be checked: the shared state is unavailable",
            code="response_ids_unavailable",
            retry_after=wait,
        ) from None
    if taken:
        raise Conflict(f"response id {value!r} is already in use", code="response_id_in_use")
    try:
        held = await held_upstream(lane.pool, value, runtime.config.health.timeout_s)
    except BaseException:
        ids.release(value, claim.holder)
        raise
    if held is not Held.FREE:
        ids.release(value, claim.holder)
    if held is Held.HELD:
        raise Conflict(f"response id {value!r} is already in use", code="response_id_in_use")
    if held is Held.UNKNOWN:
        raise Unavailable(
            "response ids cannot be checked: a backend of the pool cannot say whether it holds this one",
            code="response_ids_unavailable",
            retry_after=1.0,
        )
    return claim


async def relay_turn(
    runtime: Runtime,
    ex: Attempt,
    rm: RouteMetrics,
    key: ApiKey,
    cost: int,
    facts: RequestFacts,
    tokens: int,
    receive: Receive,
    send: Send,
) -> None:
    """Relay a Responses request (router/proxy/relay.py) with its response id claimed, bound and
    told its usage; `tokens` is the turn's prompt and output bound."""
    claim = await claim_stated(runtime, key, facts, ex.lane)
    turn = Turn(runtime=runtime, key=key, lane=ex.lane, tokens=tokens, claim=claim, ex=ex)
    ex.on_chunk = turn
    if ex.usage_tail is None:
        ex.usage_tail = UsageTail()
    try:
        await relay(runtime, ex, rm, key, cost, receive, send)
    finally:
        turn.ended(ex.record.usage_tail)
