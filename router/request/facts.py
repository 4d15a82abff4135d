"""One pass over a request body into the frozen `RequestFacts` every later step reads.

Bad input raises `BadRequest` here, before anything is forwarded. What the backend receives is
re-encoded from the parsed body (router.request.rewrite), so the router's view of the model, the stream
flag and the output bound is exactly what vLLM reads: a body the two could read differently
(duplicate keys, a field one side ignores) cannot pass one judgement and be served by another.

The output bound follows the field vLLM 0.32 honours on each route: on chat,
`max_completion_tokens` when set, else `max_tokens`; on completions, `max_tokens` only (its
request has no `max_completion_tokens`). `n` (and `best_of`, which older vLLM honours) and each
prompt of a completions batch multiply it: `sequences` is how many outputs one request makes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

import orjson

from router.errors import BadRequest
from router.request.apifacts import (
    RERANK_SIDES,
    SCORE_SIDES,
    Prompt,
    detokenize_prompt,
    pairs_prompt,
    responses_prompt,
    template_tokens,
)
from router.request.fields import Endpoint
from router.request.tokens import (
    CHARS_PER_TOKEN,
    NO_MEDIA,
    Counters,
    Media,
    PromptCosts,
    PromptCounter,
    message_text,
)

__all__ = ["PREFIX_BLOCK_CHARS", "Endpoint", "RequestFacts", "parse_facts", "prefix_chain"]

# Prefix fingerprints are chained over fixed-size character blocks (≈64 tokens each) and stop
# after PREFIX_MAX_BLOCKS, so hashing cost per request is bounded whatever the prompt length.
PREFIX_BLOCK_CHARS: Final = 64 * CHARS_PER_TOKEN
PREFIX_MAX_BLOCKS: Final = 128
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_TEXT_PARTS: Final = {"text": "text", "input_text": "text", "refusal": "refusal", "thinking": "thinking"}
_IMAGE_PARTS: Final = frozenset({"image_url", "input_image", "image_pil"})
_AUDIO_PARTS: Final = frozenset({"input_audio", "audio_url"})
_VIDEO_PARTS: Final = frozenset({"video_url"})
_OTHER_FIELDS: Final = ("name", "tool_call_id", "reasoning", "reasoning_content")
# Routes whose prompt vLLM renders with a chat template (tokenize, when it has messages).
_TEMPLATED: Final = frozenset({"chat", "responses", "tokenize"})


_API_PROMPTS: Final[dict[Endpoint, Callable[[dict[str, Any], PromptCounter], Prompt]]] = {
    "responses": responses_prompt,
    "rerank": lambda data, counter: pairs_prompt(data, counter, RERANK_SIDES),
    "score": lambda data, counter: pairs_prompt(data, counter, SCORE_SIDES),
    "detokenize": lambda data, counter: detokenize_prompt(data),
}


class RequestFacts:
    """What one request's body says, read once. A compiled class built with keywords, its fields
    final: one C call compiled, where a named tuple goes through Python's tuple constructor and a
    frozen dataclass through its generic one (docs/compiled.md)."""

    __slots__ = (
        "body",
        "endpoint",
        "has_tools",
        "include_usage",
        "max_tokens",
        "model",
        "output_ceiling",
        "prefix_chain",
        "prompt_tokens",
        "roles",
        "sequences",
        "stream",
        "token_ids",
        "user",
    )

    def __init__(
        self,
        *,
        endpoint: Endpoint,
        model: str,
        stream: bool,
        max_tokens: int | None,
        sequences: int,
        has_tools: bool,
        roles: tuple[str, ...],
        prompt_tokens: int,
        prefix_chain: tuple[bytes, ...],
        user: str | None,
        include_usage: bool,
        body: dict[str, Any],
        output_ceiling: int | None = None,
        token_ids: list[int] | None = None,
    ) -> None:
        self.endpoint: Final = endpoint
        self.model: Final = model
        self.stream: Final = stream
        self.max_tokens: Final = max_tokens  # per output sequence, as the client stated it
        self.sequences: Final = sequences  # outputs the request makes: n (or best_of) × prompts
        self.has_tools: Final = has_tools
        self.roles: Final = roles
        self.prompt_tokens: Final = prompt_tokens
        self.prefix_chain: Final = prefix_chain
        self.user: Final = user
        self.include_usage: Final = include_usage
        self.body: Final = body
        # A ceiling the client must state (Anthropic's `max_tokens`): the router writes its own
        # bound as for a request that states none, at most this (router.request.rewrite).
        self.output_ceiling: Final = output_ceiling
        # The prompt's token ids, when its count encoded them anyway (a chat template's count):
        # a `precise_prefix` lane places on them (router/request/promptids.py).
        self.token_ids: Final = token_ids

    def with_prompt_tokens(self, prompt_tokens: int) -> RequestFacts:
        """The same facts with another prompt length (a stored conversation's turns added): the
        prompt is no longer the body's, so it has no token ids."""
        return RequestFacts(
            endpoint=self.endpoint,
            model=self.model,
            stream=self.stream,
            max_tokens=self.max_tokens,
            sequences=self.sequences,
            has_tools=self.has_tools,
            roles=self.roles,
            prompt_tokens=prompt_tokens,
            prefix_chain=self.prefix_chain,
            user=self.user,
            include_usage=self.include_usage,
            body=self.body,
            output_ceiling=self.output_ceiling,
        )

    @property
    def output_tokens(self) -> int | None:
        """The output the client asked for in all, or None when it stated no bound."""
        return None if self.max_tokens is None else self.max_tokens * self.sequences

    def prefix_fingerprint(self, min_tokens: int) -> bytes | None:
        """The fingerprint of the leading `min_tokens` tokens (rounded down to whole blocks of
        PREFIX_BLOCK_CHARS, at least one), if the prompt is at least `min_tokens` long."""
        blocks = max(1, min_tokens * CHARS_PER_TOKEN // PREFIX_BLOCK_CHARS)
        if self.prompt_tokens < min_tokens or not self.prefix_chain:
            return None
        return self.prefix_chain[min(blocks, len(self.prefix_chain)) - 1]


def parse_facts(endpoint: Endpoint, body: bytes, counters: PromptCounter | Counters) -> RequestFacts:
    """`counters`: one counter, or each model's (the body's model is read first, so its prompt
    is counted by its own tokenizer in the same pass)."""
    data = json_object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", code="invalid_model")
    counter = counters.get(model) if isinstance(counters, Counters) else counters
    stream = _opt_bool(data, "stream")
    roles: tuple[str, ...] = ()
    templated: int | None = None
    token_ids: list[int] | None = None
    if endpoint == "chat" and counter.chat is not None:
        # Checked by the pass below at no cost, then counted whole by the model's chat template.
        text, roles, tool_messages, prompt_tokens = _chat_prompt(data, _UNCOUNTED)
        token_ids = counter.chat.encode(data)
        templated = None if token_ids is None else len(token_ids)
        prompts = 1
        if templated is None:
            prompt_tokens = _chat_prompt(data, counter)[3]
    elif endpoint == "chat" or (endpoint == "tokenize" and "messages" in data):
        text, roles, tool_messages, prompt_tokens = _chat_prompt(data, counter)
        prompts = 1
    elif endpoint in _API_PROMPTS:
        text, prompt_tokens, prompts, tool_messages = _API_PROMPTS[endpoint](data, counter)
    else:
        key = "input" if endpoint == "embeddings" else "prompt"
        text, prompt_tokens, prompts = _plain_prompt(data, key, counter)
        tool_messages = False
        if endpoint == "completions" and isinstance(data.get("suffix"), str):
            prompt_tokens += counter.text(data["suffix"])
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be an array", code="invalid_tools")
    if templated is not None:
        prompt_tokens = templated  # the template rendered everything the body asks it to
    elif tools:
        prompt_tokens += counter.tools(tools)
    if endpoint in _TEMPLATED and templated is None:
        # What the chat template renders beside the messages (the pooling routes count it at
        # every pair, router.request.apifacts).
        if endpoint == "chat" and data.get("documents") is not None:
            prompt_tokens += counter.rendered(data["documents"])
        prompt_tokens += template_tokens(data, counter)
    sequences = prompts
    # Only chat and completions make several outputs per prompt, and only when asked to.
    if endpoint in ("chat", "completions") and ("n" in data or "best_of" in data):
        sequences *= _samples(data, endpoint)
    # Optional fields the body leaves out (the common case) are not looked at further.
    return RequestFacts(
        endpoint=endpoint,
        model=model,
        stream=stream,
        max_tokens=_max_tokens(data, endpoint),
        sequences=sequences,
        has_tools=bool(tools) or tool_messages,
        roles=roles,
        prompt_tokens=prompt_tokens,
        prefix_chain=prefix_chain(text),
        user=_opt_str(data, "user") if "user" in data else None,
        include_usage=_include_usage(data) if "stream_options" in data else False,
        body=data,
        token_ids=token_ids,
    )


class _NoText:
    def count(self, text: str) -> int:
        return 0


# Validates a chat body without counting it, where the chat template counts it.
_UNCOUNTED: Final = PromptCounter(_NoText(), PromptCosts(per_request=0, per_message=0))


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object, or 400 `invalid_json`."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON (UTF-8): {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return data


def prefix_chain(text: str) -> tuple[bytes, ...]:
    if len(text) * 4 < PREFIX_BLOCK_CHARS:
        return ()  # not one block long, whatever its characters' UTF-8 lengths (at most 4)
    raw = text.encode("utf-8", "surrogatepass")
    limit = min(len(raw) // PREFIX_BLOCK_CHARS, PREFIX_MAX_BLOCKS)
    chain: list[bytes] = []
    parent = b""
    for i in range(limit):
        block = raw[i * PREFIX_BLOCK_CHARS : (i + 1) * PREFIX_BLOCK_CHARS]
        parent = hashlib.blake2b(parent + block, digest_size=8).digest()
        chain.append(parent)
    return tuple(chain)


def _chat_prompt(data: dict[str, Any], counter: PromptCounter) -> tuple[str, tuple[str, ...], bool, int]:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", code="invalid_messages")
    parts: list[str] = []
    roles: list[str] = []
    tool_messages = False
    tokens = counter.request()
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}] must be an object", code="invalid_messages")
        role = msg.get("role")
        if role not in _ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {sorted(_ROLES)}", code="invalid_messages")
        calls = msg.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise BadRequest(f"messages[{i}].tool_calls must be an array", code="invalid_messages")
        roles.append(role)
        tool_messages = tool_messages or role in ("tool", "function") or bool(calls)
        content = msg.get("content")
        if len(msg) == 2 and isinstance(content, str):
            # The common message, a role and a string content: its text is the content and it
            # has nothing else the template renders.
            tokens += counter.plain_message(role, content)
        else:
            content, other, media = _content(content, i)
            tokens += counter.message(role, message_text(msg), _other_text(msg, other), media)
        parts.append(role)
        parts.append(content)
    return "\n".join(parts), tuple(roles), tool_messages, tokens


def _content(content: Any, i: int) -> tuple[str, str, Media]:
    """The message's text (for fingerprints), its non-content text parts, and its media."""
    if content is None or isinstance(content, str):
        return content or "", "", NO_MEDIA
    if not isinstance(content, list):
        raise BadRequest(f"messages[{i}].content must be a string or an array", code="invalid_messages")
    texts: list[str] = []
    other: list[str] = []
    images = audio = video = 0
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"messages[{i}].content[{j}]"
        if kind in _TEXT_PARTS:
            value = part.get(_TEXT_PARTS[kind])
            if not isinstance(value, str):
                raise BadRequest(f"{where}.{_TEXT_PARTS[kind]} must be a string", code="invalid_messages")
            (texts if kind in ("text", "input_text") else other).append(value)
        elif kind in _IMAGE_PARTS:
            images += 1
        elif kind in _AUDIO_PARTS:
            audio += 1
        elif kind in _VIDEO_PARTS:
            video += 1
        else:
            raise BadRequest(f"{where}: content part type {kind!r} is not supported", code="invalid_messages")
    return "\n".join(texts), "".join(other), Media(images, audio, video)


def _other_text(msg: dict[str, Any], parts: str) -> str:
    extra = [parts] if parts else []
    for name in _OTHER_FIELDS:
        value = msg.get(name)
        if isinstance(value, str):
            extra.append(value)
    for call in msg.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("id"), str):
            extra.append(call["id"])
    return "".join(extra)


def _plain_prompt(data: dict[str, Any], key: str, counter: PromptCounter) -> tuple[str, int, int]:
    """Text (for fingerprints), prompt tokens and the number of prompts of a completions or
    embeddings input."""
    value = data.get(key)
    overhead = counter.request()
    if isinstance(value, str):
        return value, overhead + counter.text(value), 1
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return "\n".join(value), sum(overhead + counter.text(v) for v in value), len(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ",".join(map(str, value)), len(value), 1
        if all(_token_ids(v) for v in value):
            return "", sum(len(v) for v in value), len(value)
    raise BadRequest(f"'{key}' must be a string, an array of strings or of token ids", code=f"invalid_{key}")


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


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


def _positive(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"'{name}' must be a positive integer", code=f"invalid_{name}")
    return value


def _max_tokens(data: dict[str, Any], endpoint: Endpoint) -> int | None:
    if endpoint == "responses":
        return _positive(data, "max_output_tokens")
    if endpoint not in ("chat", "completions"):
        return None
    stated = _positive(data, "max_tokens")
    if endpoint == "chat" and "max_completion_tokens" in data:
        newer = _positive(data, "max_completion_tokens")
        return newer if newer is not None else stated
    return stated


def _samples(data: dict[str, Any], endpoint: Endpoint) -> int:
    n = (_positive(data, "n") or 1) if "n" in data else 1
    if endpoint != "completions" or "best_of" not in data:
        return n
    return max(n, _positive(data, "best_of") or 1)


def _include_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", code="invalid_stream_options")
    return bool(options.get("include_usage"))
