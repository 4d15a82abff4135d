"""Responses-API conversations on the backend that holds them (router.responseids).

A request with `previous_response_id` continues a conversation vLLM keeps in one server's
memory: it goes to that backend only (its ticket is pinned), through a lane whose pool holds
it, and its prompt bound includes the stored conversation's. An id this key did not create,
one the router no longer remembers, or one whose backend left its pool is answered with the
same 404, so no key learns anything about another's responses. A relayed response's id is
read from its first bytes (the JSON body's `id`, or the `response.created` event's) and
remembered the moment it passes, so a cancel can reach a response still streaming."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from router.apiroutes import RESPONSE_ID
from router.auth import ApiKey
from router.backends import Backend
from router.classify import Classification, Reason
from router.errors import BadRequest, NotFound
from router.facts import RequestFacts
from router.responseids import Holder
from router.runtime import Lane, Runtime

# A response's id is its first `"id"` (the body's own, or the response.created event's, whose
# response object begins with it); past this many bytes without one, nothing is remembered.
HEAD_LIMIT = 64 * 1024
_FIRST_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,128})"')


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
    holder = await runtime.responses.recall(response_id)
    if holder is None or holder.key != key.name:
        raise not_found(response_id)
    pool = runtime.pools.get(holder.pool)
    backend = next((b for b in pool.members if b.name == holder.backend), None) if pool else None
    lane = _lane_on(runtime, holder)
    if backend is None or lane is None:
        raise not_found(response_id)
    return Stored(holder, backend, lane)


def _lane_on(runtime: Runtime, holder: Holder) -> Lane | None:
    """The lane of the response's class if it still sends to the response's pool, else any lane
    that does."""
    lane = runtime.lanes.get(holder.cls)
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


class IdCapture:
    """Reads a response's id from its first bytes and hands it over once."""

    __slots__ = ("_head", "_on_id")

    def __init__(self, on_id: Callable[[str], None]) -> None:
        self._head: bytearray | None = bytearray()
        self._on_id = on_id

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


def capture(
    runtime: Runtime,
    key: ApiKey,
    lane: Lane,
    tokens: int,
    backend: Callable[[], Backend | None],
    status: Callable[[], int],
) -> IdCapture:
    """A capture that remembers the id of a successful response under this key, on the backend
    that answered, with `tokens` as the conversation's bound."""

    def on_id(response_id: str) -> None:
        served = backend()
        if status() != 200 or served is None:
            return
        runtime.responses.remember(response_id, Holder(key.name, served.pool, served.name, lane.cls, tokens))

    return IdCapture(on_id)
