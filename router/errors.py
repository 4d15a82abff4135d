"""The one error tree of lane-router.

Every failure the router can answer with is a `RouterError`. Each subclass carries the HTTP
status and the OpenAI error ``type``/``code`` it maps to, so the mapping to HTTP lives here and
nowhere else (`envelope()` and `RouterError.status`).

    RouterError
    ├── ClientError                       4xx: the request is at fault
    │   ├── BadRequest            400     malformed JSON, wrong field types, bad UTF-8
    │   ├── Unauthorized          401     missing or unknown key
    │   ├── Forbidden             403     key lacks the scope, class or model
    │   ├── NotFound              404     unknown route or model
    │   ├── MethodNotAllowed      405     known route, wrong method
    │   ├── Conflict              409     a response id the request names is in use
    │   ├── PayloadTooLarge       413     body above max_body_bytes
    │   └── RateLimited           429     per-key requests/tokens/concurrency limit
    ├── Unavailable               503     no healthy backend, lane queue full or deadline passed
    └── UpstreamError             502     the backend failed
        ├── UpstreamConnectError  502     refused / connect timeout / pool exhausted: the backend
        │                                 never saw the request, so another may be tried
        ├── UpstreamTimeout       504     no response head in time, or the body fell silent
        ├── UpstreamProtocolError 502     broken HTTP, or a response head over the size limits
        ├── UpstreamClosed        502     the backend closed the connection after the request went
        │                                 out (before or during its response): never retried
        ├── UpstreamAuthFailed    502     the backend refused the pool's upstream key (its 401/403)
        └── AdapterLoadFailed     502     the backend did not load the LoRA adapter the router asked
                                          it to (router/fleet/adapterload.py)

Messages of upstream errors reach clients: they name a backend by its pool and its index there
(`router.fleet.backend.backend_label`), never by its address.
"""

from __future__ import annotations

from typing import Final

import orjson

# The longest Retry-After the router computes outside a lane's queue (a lane's is bounded by its
# `queue_timeout_s`): a rate bucket refills whole within it, and clients honour it (the openai
# SDK ignores one above two minutes and falls back to its own short backoff).
RETRY_AFTER_MAX_S: Final = 60.0


class RouterError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.extra_headers = dict(headers or {})

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.extra_headers.items()]
        if self.retry_after is not None:
            out.append((b"retry-after", str(max(1, round(self.retry_after))).encode()))
        return out

    def envelope(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.envelope())


class ClientError(RouterError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class BadRequest(ClientError):
    status = 400
    code = "invalid_request"


class Unauthorized(ClientError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ClientError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(ClientError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class MethodNotAllowed(ClientError):
    status = 405
    code = "method_not_allowed"


class Conflict(ClientError):
    status = 409
    code = "conflict"


class LengthRequired(ClientError):
    status = 411
    code = "length_required"


class PayloadTooLarge(ClientError):
    status = 413
    code = "payload_too_large"


class RateLimited(ClientError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class Unavailable(RouterError):
    status = 503
    type = "service_unavailable"
    code = "no_healthy_backend"


class UpstreamError(RouterError):
    status = 502
    type = "upstream_error"
    code = "bad_gateway"
    retryable: bool = False


class UpstreamConnectError(UpstreamError):
    code = "upstream_connect_error"
    retryable = True


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamProtocolError(UpstreamError):
    code = "upstream_protocol_error"


class UpstreamClosed(UpstreamError):
    code = "upstream_closed"


class UpstreamAuthFailed(UpstreamError):
    code = "upstream_auth_failed"


class AdapterLoadFailed(UpstreamError):
    code = "adapter_load_failed"


def error_event(err: RouterError) -> bytes:
    """The SSE event that ends a stream which already sent its status line."""
    return b"data: " + err.body() + b"\n\n"


# Anthropic's error types by status; a status not named is the server's (`api_error`).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_envelope(err: RouterError) -> dict[str, object]:
    """The error body of the Anthropic Messages routes: their clients read `error.type` (by
    status, as Anthropic's API sets it) and `error.message`."""
    kind = _ANTHROPIC_TYPES.get(err.status)
    if kind is None:
        kind = "invalid_request_error" if 400 <= err.status < 500 else "api_error"
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def anthropic_error_event(err: RouterError) -> bytes:
    """The SSE event that ends an Anthropic stream which already sent its status line."""
    return b"event: error\ndata: " + orjson.dumps(anthropic_envelope(err)) + b"\n\n"
