"""Anthropic's Messages API as vLLM 0.32 answers it (`/v1/messages`, `/v1/messages/count_tokens`),
for the fake backend (tests/support/fakebackend.py), and the helpers a test of the router's
Anthropic routes needs: a profile whose key may use them, the `anthropic` SDK pointed at the
router, and a reader of SSE events.

A message's text is `" t0 t1 …"`, one piece per token, at most `max_tokens` of them; a stream is
vLLM's sequence of events (message_start, one content block of text deltas, message_delta with
the usage, message_stop), each an `event:` line and a `data:` line."""

from __future__ import annotations

from typing import Any

import anthropic
import orjson

from router.keys.auth import hash_key
from tests.support.profiles import profile

MESSAGES_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})

# A key whose `routes:` open the Anthropic routes (and chat, to tell the two apart).
MESSAGES_KEY = "messages-key-0123456789"


def messages_profile(urls: list[str], **top: Any) -> dict[str, Any]:
    """The test profile, with key `messages` allowed the Anthropic routes."""
    data = profile(urls, **top)
    data["keys"] = [
        *data["keys"],
        {"name": "messages", "sha256": hash_key(MESSAGES_KEY), "routes": ["messages", "chat"]},
    ]
    return data


def sdk(url: str, key: str = MESSAGES_KEY, x_api_key: bool = False) -> anthropic.AsyncAnthropic:
    """The real `anthropic` client against the router at `url`. It sends its key as a bearer
    token; `x_api_key`: in `x-api-key` instead, as Anthropic's API takes it and other clients
    send it."""
    if x_api_key:
        return anthropic.AsyncAnthropic(
            base_url=url, api_key=None, default_headers={"X-Api-Key": key}, max_retries=0, timeout=10
        )
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0, timeout=10)


def input_tokens(request: dict[str, Any]) -> int:
    """The fake's prompt count: a token per 4 bytes of the request's system and messages."""
    return max(1, len(orjson.dumps([request.get("system"), request.get("messages")])) // 4)


def message(request: dict[str, Any], model: str, tokens: int) -> bytes:
    """A whole message's body: `tokens` pieces of text."""
    return orjson.dumps(
        {
            "id": "chatcmpl-fake",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "".join(f" t{i}" for i in range(tokens))}],
            "model": model,
            "stop_reason": "max_tokens",
            "usage": {"input_tokens": input_tokens(request), "output_tokens": tokens},
        }
    )


def count(request: dict[str, Any]) -> bytes:
    n = input_tokens(request)
    return orjson.dumps({"input_tokens": n, "context_management": {"original_input_tokens": n}})


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps({"type": name, **data}))


def stream_head(request: dict[str, Any], model: str) -> bytes:
    start = {
        "id": "chatcmpl-fake",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "usage": {"input_tokens": input_tokens(request), "output_tokens": 0},
    }
    return event("message_start", {"message": start}) + event(
        "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
    )


def stream_token(i: int) -> bytes:
    return event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f" t{i}"}})


def stream_tail(request: dict[str, Any], tokens: int) -> bytes:
    usage = {"input_tokens": input_tokens(request), "output_tokens": tokens}
    delta = {"delta": {"stop_reason": "max_tokens"}, "usage": usage}
    return (
        event("content_block_stop", {"index": 0}) + event("message_delta", delta) + event("message_stop", {})
    )


def error(status: int) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": "scripted", "message": f"scripted {status}"}})


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of an SSE body of `event:` and `data:` lines."""
    out: list[tuple[str, dict[str, Any]]] = []
    for block in raw.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        if b"data" in lines:
            out.append((lines.get(b"event", b"").decode(), orjson.loads(lines[b"data"])))
    return out
