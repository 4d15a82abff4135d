"""One pass over a request body into the frozen `RequestFacts` every later step reads.

Bad input raises `BadRequest` here, before anything is forwarded. The body bytes themselves are
forwarded unchanged; parsing never re-encodes what the client sent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from router.errors import BadRequest
from router.tokens import CHARS_PER_TOKEN, TokenCounter, message_text

Endpoint = Literal["chat", "completions", "embeddings"]

# Prefix fingerprints are chained over fixed-size character blocks (≈64 tokens each) and stop
# after PREFIX_MAX_BLOCKS, so hashing cost per request is bounded whatever the prompt length.
PREFIX_BLOCK_CHARS = 64 * CHARS_PER_TOKEN
PREFIX_MAX_BLOCKS = 128
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True, slots=True)
class RequestFacts:
    endpoint: Endpoint
    model: str
    stream: bool
    max_tokens: int | None
    has_tools: bool
    roles: tuple[str, ...]
    prompt_tokens: int
    prefix_chain: tuple[bytes, ...]
    user: str | None
    include_usage: bool

    def prefix_fingerprint(self, min_tokens: int) -> bytes | None:
        """The fingerprint of the leading `min_tokens` tokens (rounded down to whole blocks of
        PREFIX_BLOCK_CHARS, at least one), if the prompt is at least `min_tokens` long."""
        blocks = max(1, min_tokens * CHARS_PER_TOKEN // PREFIX_BLOCK_CHARS)
        if self.prompt_tokens < min_tokens or not self.prefix_chain:
            return None
        return self.prefix_chain[min(blocks, len(self.prefix_chain)) - 1]


def parse_facts(endpoint: Endpoint, body: bytes, counter: TokenCounter) -> RequestFacts:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON (UTF-8): {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", code="invalid_model")
    stream = _opt_bool(data, "stream")
    max_tokens = _max_tokens(data)
    if endpoint == "chat":
        text, roles, tool_messages = _chat_prompt(data)
        prompt_tokens = sum(counter.count(message_text(m)) for m in data["messages"])
    else:
        key = "prompt" if endpoint == "completions" else "input"
        text, prompt_tokens = _plain_prompt(data, key, counter)
        roles, tool_messages = (), False
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be an array", code="invalid_tools")
    return RequestFacts(
        endpoint=endpoint,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        has_tools=bool(tools) or tool_messages,
        roles=roles,
        prompt_tokens=prompt_tokens,
        prefix_chain=prefix_chain(text),
        user=_opt_str(data, "user"),
        include_usage=_include_usage(data),
    )


def prefix_chain(text: str) -> tuple[bytes, ...]:
    raw = text.encode("utf-8", "surrogatepass")
    limit = min(len(raw) // PREFIX_BLOCK_CHARS, PREFIX_MAX_BLOCKS)
    chain: list[bytes] = []
    parent = b""
    for i in range(limit):
        block = raw[i * PREFIX_BLOCK_CHARS : (i + 1) * PREFIX_BLOCK_CHARS]
        parent = hashlib.blake2b(parent + block, digest_size=8).digest()
        chain.append(parent)
    return tuple(chain)


def _chat_prompt(data: dict[str, Any]) -> tuple[str, tuple[str, ...], bool]:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", code="invalid_messages")
    parts: list[str] = []
    roles: list[str] = []
    tool_messages = False
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}] must be an object", code="invalid_messages")
        role = msg.get("role")
        if role not in _ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {sorted(_ROLES)}", code="invalid_messages")
        roles.append(role)
        tool_messages = tool_messages or role in ("tool", "function") or bool(msg.get("tool_calls"))
        parts.append(role)
        parts.append(_content_text(msg.get("content"), i))
    return "\n".join(parts), tuple(roles), tool_messages


def _content_text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise BadRequest(f"messages[{i}].content parts must be objects", code="invalid_messages")
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
        return "\n".join(texts)
    raise BadRequest(f"messages[{i}].content must be a string or an array", code="invalid_messages")


def _plain_prompt(data: dict[str, Any], key: str, counter: TokenCounter) -> tuple[str, int]:
    value = data.get(key)
    if isinstance(value, str):
        return value, counter.count(value)
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return "\n".join(value), sum(counter.count(v) for v in value)
        if all(isinstance(v, int) for v in value):
            return ",".join(map(str, value)), len(value)
        if all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value):
            return "", sum(len(v) for v in value)
    raise BadRequest(f"'{key}' must be a string, an array of strings or of token ids", code=f"invalid_{key}")


def _opt_bool(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean", code=f"invalid_{name}")
    return value


def _opt_str(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string", code=f"invalid_{name}")
    return value


def _max_tokens(data: dict[str, Any]) -> int | None:
    found = None
    for name in ("max_tokens", "max_completion_tokens"):
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"'{name}' must be a positive integer", code=f"invalid_{name}")
        found = value  # max_completion_tokens, the newer name, wins when both are sent
    return found


def _include_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", code="invalid_stream_options")
    return bool(options.get("include_usage"))
