"""The proxied routes: which path each client path is sent to, the key scope it needs, and what
the router may write into its body. Pure, a frozen table.

The path sent upstream is the router's constant for the route: vLLM's aliases (`/v1/rerank`,
`/v2/rerank`, `/v1/score`) go to its canonical paths (`/rerank`, `/score`), which vLLM serves
without its deprecation warnings. `priority` and `cache_salt` are written only where vLLM's
request for the route has the field: vLLM warns about fields a request does not define."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from router.config.models import RouteScope
from router.request.fields import Endpoint


@dataclass(frozen=True, slots=True)
class ApiRoute:
    endpoint: Endpoint
    scope: RouteScope
    target: bytes
    engine_fields: bool = True  # vLLM's request has `priority` and `cache_salt`
    multipart: bool = False
    # Anthropic's Messages API: its body, its key header (`x-api-key`) and its error envelope.
    anthropic: bool = False
    priority: bool = True  # vLLM's request has `priority` (Anthropic's has `cache_salt` alone)


def _route(endpoint: Endpoint, scope: RouteScope, target: str, **kw: bool) -> ApiRoute:
    return ApiRoute(endpoint, scope, target.encode(), **kw)


_CHAT: Final = _route("chat", RouteScope.CHAT, "/v1/chat/completions")
_RERANK: Final = _route("rerank", RouteScope.RERANK, "/rerank")
_SCORE: Final = _route("score", RouteScope.SCORE, "/score")
_TRANSCRIBE: Final = _route(
    "transcriptions", RouteScope.AUDIO, "/v1/audio/transcriptions", engine_fields=False, multipart=True
)
_TRANSLATE: Final = _route(
    "translations", RouteScope.AUDIO, "/v1/audio/translations", engine_fields=False, multipart=True
)

_MESSAGES: Final = _route("messages", RouteScope.MESSAGES, "/v1/messages", anthropic=True, priority=False)
_COUNT_TOKENS: Final = _route(
    "count_tokens", RouteScope.MESSAGES, "/v1/messages/count_tokens", engine_fields=False, anthropic=True
)

PROXIED: Final[dict[bytes, ApiRoute]] = {
    b"/v1/chat/completions": _CHAT,
    b"/v1/completions": _route("completions", RouteScope.COMPLETIONS, "/v1/completions"),
    b"/v1/embeddings": _route("embeddings", RouteScope.EMBEDDINGS, "/v1/embeddings"),
    b"/v1/responses": _route("responses", RouteScope.RESPONSES, "/v1/responses"),
    b"/rerank": _RERANK,
    b"/v1/rerank": _RERANK,
    b"/v2/rerank": _RERANK,
    b"/score": _SCORE,
    b"/v1/score": _SCORE,
    b"/tokenize": _route("tokenize", RouteScope.TOKENIZE, "/tokenize", engine_fields=False),
    b"/detokenize": _route("detokenize", RouteScope.TOKENIZE, "/detokenize", engine_fields=False),
    b"/v1/audio/transcriptions": _TRANSCRIBE,
    b"/v1/audio/translations": _TRANSLATE,
    b"/v1/messages": _MESSAGES,
    b"/v1/messages/count_tokens": _COUNT_TOKENS,
}

# Upstream paths whose errors, before and within a response, are written in Anthropic's envelope.
ANTHROPIC_TARGETS: Final = frozenset(api.target for api in PROXIED.values() if api.anthropic)


def anthropic_errors(path: bytes) -> bool:
    """Whether the router's errors on `path` are written in Anthropic's envelope: its routes',
    and those of the paths below them it does not serve (Anthropic's batches, …)."""
    api = PROXIED.get(path)
    return api.anthropic if api is not None else path.startswith(b"/v1/messages/")


# Routes that generate no tokens: no output bound is judged or written.
NO_OUTPUT: Final[frozenset[Endpoint]] = frozenset(
    {"embeddings", "rerank", "score", "tokenize", "detokenize", "count_tokens"}
)

# The id part of `/v1/responses/{id}` and `/v1/responses/{id}/cancel`. vLLM's ids are
# `resp_` and hex digits; the charset admits no path syntax, so the path sent upstream is still
# built only of the router's constants and a validated token.
RESPONSES_PREFIX: Final = b"/v1/responses/"
RESPONSE_ID: Final = re.compile(rb"resp_[A-Za-z0-9_-]{1,128}")
_STORED: Final = re.compile(rb"/v1/responses/(resp_[A-Za-z0-9_-]{1,128})(/cancel)?")


@dataclass(frozen=True, slots=True)
class StoredRoute:
    """`GET /v1/responses/{id}` (retrieve) or `POST /v1/responses/{id}/cancel`."""

    response_id: str
    cancel: bool

    @property
    def method(self) -> str:
        return "POST" if self.cancel else "GET"

    @property
    def target(self) -> bytes:
        path = RESPONSES_PREFIX + self.response_id.encode()
        return path + b"/cancel" if self.cancel else path


def stored_route(raw_path: bytes) -> StoredRoute | None:
    """The stored-response route `raw_path` names exactly, if any."""
    found = _STORED.fullmatch(raw_path)
    if found is None:
        return None
    return StoredRoute(found[1].decode("ascii"), found[2] is not None)
