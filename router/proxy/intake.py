"""What a request brings before any decision: the few headers the router reads, its id, and
its body, read within the profile's limit."""

from __future__ import annotations

from typing import Final

from router.app.asgi import Receive
from router.errors import BadRequest, PayloadTooLarge
from router.keys.auth import ApiKey
from router.observe.record import RequestIds
from router.observe.tracecontext import NO_CLIENT_TRACE, ClientTrace, client_trace


class ClientGone(Exception):
    """The client disconnected; nothing more is to be sent."""


# Each header read, by its place in the scan's list (that of the attribute holding it, the last
# copy). The first _SINGLE places decide who a request is and where it goes: a second copy is
# refused, since proxies in front of the router and the router itself could each read a
# different one. _TRACE keeps every traceparent and tracestate line. Headers clients commonly
# send that the router does not read share _UNREAD, a place no attribute takes: found as they
# come (servers lower header names), they need no lowering to be passed over.
_SINGLE: Final = 5
_TRACE: Final = 9
_UNREAD: Final = 10
_UNREAD_NAMES: Final = (
    b"host",
    b"user-agent",
    b"accept-encoding",
    b"connection",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-real-ip",
    b"x-stainless-arch",
    b"x-stainless-async",
    b"x-stainless-lang",
    b"x-stainless-os",
    b"x-stainless-package-version",
    b"x-stainless-read-timeout",
    b"x-stainless-retry-count",
    b"x-stainless-runtime",
    b"x-stainless-runtime-version",
)
_PLACES: Final = {
    **dict.fromkeys(_UNREAD_NAMES, _UNREAD),
    b"authorization": 0,
    b"x-request-class": 1,
    b"x-client-id": 2,
    b"x-session-id": 3,
    b"x-api-key": 4,  # the key as Anthropic's clients send it (router.keys.auth.credentials)
    b"content-length": 5,
    b"content-type": 6,
    b"x-request-id": 7,
    b"accept": 8,
    b"traceparent": _TRACE,
    b"tracestate": _TRACE,
}


class Headers:
    """The few request headers the router reads, found in one pass."""

    __slots__ = (
        "accept",
        "api_key",
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
        found: list[bytes | None] = [None] * (_UNREAD + 1)
        trace: list[tuple[bytes, bytes]] | None = None  # traceparent and tracestate lines
        places = _PLACES
        for name, value in raw:
            place = places.get(name)
            if place is None:
                name = name.lower()
                place = places.get(name)
                if place is None:
                    continue
            if place == _TRACE:
                if trace is None:
                    trace = []
                trace.append((name, value))
                continue
            # Every value is bytes, never None: a place already filled is a second copy.
            if place < _SINGLE and found[place] is not None:
                raise BadRequest(f"more than one {name.decode()} header", code="duplicate_header")
            found[place] = value
        (
            self.authorization,
            self.request_class,
            self.client_id,
            self.session_id,
            self.api_key,
            self.content_length,
            self.content_type,
            self.request_id,
            self.accept,
            _,
            _,
        ) = found
        self.trace = trace

    def client_trace(self) -> ClientTrace:
        if self.trace is None:
            return NO_CLIENT_TRACE
        parents = [v for n, v in self.trace if n == b"traceparent"]
        return client_trace(parents, [v for n, v in self.trace if n == b"tracestate"])


def request_id(supplied: bytes | None, ids: RequestIds) -> bytes:
    """The client's X-Request-Id when it is a plain visible-ASCII token, else a fresh one."""
    if supplied and len(supplied) <= 128 and all(33 <= ch <= 126 for ch in supplied):
        return supplied
    return ids.fresh()


def upstream_request_id(key: ApiKey, rid: bytes) -> bytes:
    """The id vLLM sees, under the key's name: vLLM names the request after it, and two
    tenants choosing the same id must not meet there. Key names cannot contain ':'."""
    return key.id_prefix + rid


async def read_body(receive: Receive, limit: int, declared: bytes | None) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is larger than {limit} bytes")
    # Mostly the body comes in one message: it is returned as it came, with no list to join.
    parts: list[bytes] | None = None
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        if not message.get("more_body"):
            if parts is None:
                return chunk
            parts.append(chunk)
            return b"".join(parts)
        if parts is None:
            parts = []
        parts.append(chunk)
