"""What a request brings before any decision: the few headers the router reads, its id, and
its body, read within the profile's limit."""

from __future__ import annotations

from router.asgi import Receive
from router.auth import ApiKey
from router.errors import BadRequest, PayloadTooLarge
from router.requestrecord import RequestIds
from router.tracecontext import NO_CLIENT_TRACE, ClientTrace, client_trace


class ClientGone(Exception):
    """The client disconnected; nothing more is to be sent."""


# Headers that decide who a request is and where it goes: a second copy is refused, since
# proxies in front of the router and the router itself could each read a different one.
_SINGLE = frozenset({b"authorization", b"x-request-class", b"x-client-id", b"x-session-id"})
# Each header read, by the attribute that holds it (the last copy, for those not in _SINGLE);
# `trace` keeps every traceparent and tracestate line.
_FIELDS = {
    b"authorization": "authorization",
    b"content-length": "content_length",
    b"content-type": "content_type",
    b"x-request-id": "request_id",
    b"x-request-class": "request_class",
    b"accept": "accept",
    b"x-session-id": "session_id",
    b"x-client-id": "client_id",
    b"traceparent": "trace",
    b"tracestate": "trace",
}


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
        for name, value in raw:
            n = name.lower()
            field = _FIELDS.get(n)
            if field is None:
                continue
            if field == "trace":
                if self.trace is None:
                    self.trace = []
                self.trace.append((n, value))
                continue
            # Every value is bytes, never None: a field already set is a second copy.
            if n in _SINGLE and getattr(self, field) is not None:
                raise BadRequest(f"more than one {n.decode()} header", code="duplicate_header")
            setattr(self, field, value)

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
