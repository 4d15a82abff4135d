"""`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: a stored response, asked of
the backend that holds it (router.proxy.conversation), through the lane it was served on, with
the key's rate limits (a request of no tokens) and the relay's disconnect handling.

The query of a retrieve is read, not passed through: only vLLM's `stream` and
`starting_after` are accepted, and the router writes them again itself."""

from __future__ import annotations

import time

from router.app.asgi import Message, Receive, Send
from router.app.routes import StoredRoute
from router.config.models import RouteScope
from router.errors import BadRequest
from router.lanes.poolgate import Ticket
from router.observe.record import RequestRecord
from router.proxy import conversation
from router.proxy.attempt import Attempt
from router.proxy.handler import observed, start_record
from router.proxy.intake import Headers, read_body, upstream_request_id
from router.proxy.relay import relay
from router.state.runtime import Runtime

# A retrieve or cancel has no body to speak of; anything larger is refused unread.
MAX_BODY_BYTES = 4096


async def handle_stored(
    runtime: Runtime, stored: StoredRoute, scope: Message, receive: Receive, send: Send
) -> None:
    headers = Headers(scope["headers"])
    rec = start_record(runtime, headers, scope)
    await observed(runtime, rec, _stored(runtime, rec, stored, headers, scope, receive, send))


async def _stored(
    runtime: Runtime,
    rec: RequestRecord,
    stored: StoredRoute,
    headers: Headers,
    scope: Message,
    receive: Receive,
    send: Send,
) -> None:
    rid = rec.request_id
    key = runtime.keys.authenticate(headers.authorization)
    rec.key_name = key.name
    key.allow_route(RouteScope.RESPONSES)
    query, stream = retrieve_query(scope.get("query_string") or b"", stored.cancel)
    await read_body(receive, MAX_BODY_BYTES, headers.content_length)
    found = await conversation.find(runtime, key, stored.response_id)
    lane = found.lane
    rec.cls, rec.lane, rec.pool, rec.stream = lane.cls.value, lane.name, lane.pool.name, stream
    rec.classified_at = time.monotonic()
    rm = runtime.metrics.route(lane.cls.value, lane.name, lane.pool.name)
    ex = Attempt(
        lane=lane,
        target=stored.target + query,
        body=b"",
        request_id=upstream_request_id(key, rid),
        accept=headers.accept,
        ticket=Ticket(lane=lane, long=False, affinity=None, pin=found.backend),
        started=rec.started,
        response_headers=[(b"x-request-id", rid)],
        gaps=rm.itl,
        record=rec,
        stream=stream,
        client=(key.name, headers.client_id, None),
        method=stored.method.encode(),
        trace_headers=runtime.observer.upstream_headers(rec),
    )
    ex.ticket.tenant = key.tenant
    await relay(runtime, ex, rm, key, 0, receive, send)


def retrieve_query(raw: bytes, cancel: bool) -> tuple[bytes, bool]:
    """The query sent upstream (rebuilt from the accepted parameters) and whether it streams."""
    if not raw:
        return b"", False
    if cancel:
        raise BadRequest("cancel takes no query parameters", code="invalid_query")
    params: dict[bytes, bytes] = {}
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        if name in params:
            raise BadRequest(f"query parameter {name.decode('latin-1')!r} given twice", code="invalid_query")
        params[name] = value
    stream = params.pop(b"stream", b"false").lower()
    after = params.pop(b"starting_after", None)
    if params or stream not in (b"true", b"false"):
        raise BadRequest("a retrieve takes only stream=true|false and starting_after=N", code="invalid_query")
    parts = [b"stream=" + stream]
    if after is not None:
        if not after.isdigit() or len(after) > 9:
            raise BadRequest("starting_after must be a non-negative integer", code="invalid_query")
        parts.append(b"starting_after=" + after)
    return b"?" + b"&".join(parts), stream == b"true"
