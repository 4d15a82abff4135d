"""OpenAI-compatible request parsing and response bytes, shaped like vLLM's.

Parsing turns a JSON body into a `GenerationRequest` (or raises the project's BadRequest /
NotFound with vLLM's messages). Formatting builds SSE chunks from prebuilt byte prefixes, since
a chunk is written per token and must stay cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from router.errors import BadRequest, NotFound, RouterError
from router.lab.sim.token_ids import FILLER_WORDS, chat_token_ids, filler_token
from router.request.simtokens import completion_token_ids

Kind = Literal["chat", "completion"]

# vLLM's error `type` per HTTP status.
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    413: "RequestEntityTooLarge",
    503: "ServiceUnavailableError",
}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    seed: int | None
    priority: int
    cache_salt: str | None = None


def vllm_error_body(err: RouterError) -> bytes:
    kind = _ERROR_TYPES.get(err.status, "InternalServerError")
    return orjson.dumps({"error": {"message": err.message, "type": kind, "param": None, "code": err.status}})


def _int_field(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {value!r}.")
    return value


def _cache_salt(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
    return salt


def parse_generation(
    body: Any,
    kind: Kind,
    *,
    served_models: Sequence[str],
    max_model_len: int,
    priority_enabled: bool,
) -> GenerationRequest:
    if not isinstance(body, Mapping):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model") or served_models[0]
    if model not in served_models:
        raise NotFound(f"The model `{model}` does not exist.", code="model_not_found")
    prompt_ids = _chat_prompt(body) if kind == "chat" else _completion_prompt(body)
    n = _int_field(body, "n", 1)
    if n != 1:
        raise BadRequest("The simulator serves n=1 only.")
    max_tokens = _int_field(body, "max_completion_tokens", None) if kind == "chat" else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", None)
    prompt_len = len(prompt_ids)
    if prompt_len >= max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. Please reduce the length of the input."
        )
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
    if prompt_len + max_tokens > max_model_len:
        raise BadRequest(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has "
            f"{prompt_len} input tokens ({max_tokens} > {max_model_len} - {prompt_len})."
        )
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    if not 0 <= min_tokens <= max_tokens:
        raise BadRequest(f"min_tokens must be between 0 and max_tokens={max_tokens}.")
    priority = _int_field(body, "priority", 0) or 0
    if priority and not priority_enabled:
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.")
    options = body.get("stream_options")
    include_usage = bool(isinstance(options, Mapping) and options.get("include_usage"))
    return GenerationRequest(
        kind=kind,
        model=str(model),
        prompt_token_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stream=bool(body.get("stream", False)),
        include_usage=include_usage,
        seed=_int_field(body, "seed", None),
        priority=priority,
        cache_salt=_cache_salt(body),
    )


def _chat_prompt(body: Mapping[str, Any]) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list.")
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
        raise BadRequest("Each message must be an object with a 'role'.")
    return chat_token_ids(messages)


def _completion_prompt(body: Mapping[str, Any]) -> list[int]:
    ids = completion_token_ids(body.get("prompt"))
    if ids is None:
        raise BadRequest("'prompt' must be a string, a list of token ids, or a list of one of those.")
    return ids


def output_text(seed: int, start: int, stop: int) -> str:
    if stop == start + 1:
        return FILLER_WORDS[filler_token(seed, start)]
    return "".join(FILLER_WORDS[filler_token(seed, i)] for i in range(start, stop))


class ChunkWriter:
    """SSE bytes of one streamed response."""

    def __init__(self, kind: Kind, response_id: str, model: str, created: int) -> None:
        self.kind = kind
        head = orjson.dumps({"id": response_id})[:-1]
        if kind == "chat":
            head += b',"object":"chat.completion.chunk"'
        else:
            head += b',"object":"text_completion"'
        head += b',"created":' + str(created).encode() + b',"model":' + orjson.dumps(model)
        self._head = b"data: " + head
        if kind == "chat":
            self._open = b',"choices":[{"index":0,"delta":{"content":'
            self._close = b'},"logprobs":null,"finish_reason":'
        else:
            self._open = b',"choices":[{"index":0,"text":'
            self._close = b',"logprobs":null,"finish_reason":'

    def role(self) -> bytes:
        return (
            self._head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def text(self, text: str, finish_reason: str | None = None) -> bytes:
        if finish_reason is None:
            tail = b"null" + (b"}]}\n\n" if self.kind == "chat" else b',"stop_reason":null}]}\n\n')
        else:
            tail = b'"' + finish_reason.encode() + b'","stop_reason":null}]}\n\n'
        return self._head + self._open + orjson.dumps(text) + self._close + tail

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = _usage(prompt_tokens, completion_tokens)
        return self._head + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def full_response(
    kind: Kind,
    response_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> bytes:
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": response_id,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage(prompt_tokens, completion_tokens),
        }
    )
