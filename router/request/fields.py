"""Which body fields a key may send on each route, and their bounds. Pure.

vLLM reads far more of a request body than the OpenAI API defines, and it obeys all of it: a
tenant that reaches it unfiltered can jump its scheduler's queue (`priority`), read or poison
another tenant's prefix cache (`cache_salt`), hand it its own chat template, or pass parameters
to extensions. So the body is checked against an allowlist per route, as vLLM 0.32 defines the
routes' fields:

* the OpenAI fields and vLLM's sampling extras are open to every key, some with a numeric bound
  (`n`, `best_of`, `logprobs`, `top_logprobs`, `prompt_logprobs`, and the output length), and
  what vLLM compiles into an output grammar with a bound on its size;
* the engine's own knobs (`ENGINE_FIELDS`) only to keys whose `request_fields.allow` names them;
  where the profile asks for it the router sets `priority` and `cache_salt` itself;
* anything else is refused, so a field no check knows about never reaches the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from router.errors import BadRequest, Forbidden
from router.request.apifields import (
    AUDIO_FIELDS,
    COUNT_TOKENS_FIELDS,
    DETOKENIZE_FIELDS,
    MESSAGES_FIELDS,
    RERANK_FIELDS,
    RESPONSES_FIELDS,
    SCORE_FIELDS,
    TOKENIZE_FIELDS,
)

Endpoint = Literal[
    "chat",
    "completions",
    "embeddings",
    "responses",
    "rerank",
    "score",
    "tokenize",
    "detokenize",
    "transcriptions",
    "translations",
    "messages",
    "count_tokens",
]

# OpenAI fields vLLM accepts and ignores; refusing them would break ordinary clients.
_IGNORED_OPENAI: Final = frozenset(
    {"metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key", "verbosity"}
)

_SAMPLING: Final = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "user",
        "n",
        "seed",
        "stop",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "length_penalty",
        "logit_bias",
        "logprobs",
        "prompt_logprobs",
        "logprob_token_ids",
        "use_beam_search",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "truncation_side",
        "allowed_token_ids",
        "bad_words",
        "echo",
        "add_special_tokens",
        "response_format",
        "structured_outputs",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "thinking_token_budget",
        "stream_interval",
        "watermarking",
        "max_tokens",
    }
)

OPEN_FIELDS: Final[Mapping[Endpoint, frozenset[str]]] = {
    "chat": _SAMPLING
    | _IGNORED_OPENAI
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
        "include_reasoning",
        "add_generation_prompt",
        "continue_final_message",
        "documents",
        "chat_template_kwargs",
        "modalities",
        "prediction",
        "audio",
        "web_search_options",
        "functions",
        "function_call",
    },
    "completions": _SAMPLING | _IGNORED_OPENAI | {"prompt", "suffix", "best_of"},
    "embeddings": _IGNORED_OPENAI
    | {
        "model",
        "input",
        "user",
        "encoding_format",
        "dimensions",
        "truncate_prompt_tokens",
        "truncation_side",
        "padding",
        "add_special_tokens",
        "embed_dtype",
        "endianness",
        "use_activation",
    },
    "responses": RESPONSES_FIELDS | _IGNORED_OPENAI,
    "rerank": RERANK_FIELDS,
    "score": SCORE_FIELDS,
    "tokenize": TOKENIZE_FIELDS,
    "detokenize": DETOKENIZE_FIELDS,
    "transcriptions": AUDIO_FIELDS,
    "translations": AUDIO_FIELDS,
    "messages": MESSAGES_FIELDS,
    "count_tokens": COUNT_TOKENS_FIELDS,
}

# The engine's own knobs: scheduling order, cache isolation, request identity, templates,
# multimodal preprocessing, disaggregated-serving hand-offs and extension parameters; and
# `repetition_detection`, which vLLM's scheduler checks after every output token in a loop over
# every pattern size up to the one asked for: an unbounded size costs the engine's one
# scheduling thread time quadratic in the output, for every tenant.
ENGINE_FIELDS: Final = frozenset(
    {
        "repetition_detection",
        "priority",
        "cache_salt",
        "request_id",
        "session_id",
        "kv_transfer_params",
        "ec_transfer_params",
        "vllm_xargs",
        "chat_template",
        "mm_processor_kwargs",
        "media_io_kwargs",
        "prompt_embeds",
        "return_prompt_text",
        "return_token_offsets",
        "routed_experts_prompt_start",
        "mm_payload",
        "return_mm_kwargs",
    }
)

# Bounded fields and their bounds when neither the profile nor the key sets one. `max_tokens`
# bounds the output per sequence whichever field states it; unset, only the lane bounds it.
# `grammar_bytes` bounds what vLLM compiles into an output grammar (below).
LIMITED_FIELDS: Final = frozenset(
    {"n", "best_of", "logprobs", "top_logprobs", "prompt_logprobs", "max_tokens", "grammar_bytes"}
)
DEFAULT_LIMITS: Final[Mapping[str, int]] = {
    "n": 8,
    "best_of": 8,
    "logprobs": 20,
    "top_logprobs": 20,
    "prompt_logprobs": 0,
}


# What vLLM compiles into a grammar that constrains the output: `response_format` and
# `structured_outputs` (chat, completions), `text` (Responses), `output_config` (Anthropic
# Messages), and the tools when `tool_choice` forces a call. Compiling takes CPU time that grows
# faster than the spec's size (a JSON schema of 30 KiB takes under a second, one of 220 KiB some
# 20 s): its JSON bytes are bounded.
GRAMMAR_FIELDS: Final = ("response_format", "structured_outputs", "text", "output_config")
DEFAULT_GRAMMAR_BYTES: Final = 32768
_UNFORCED: Final = frozenset({"auto", "none"})

# The bounded fields that are counts, in the order they are checked.
_COUNTED_ORDER: Final = ("n", "best_of", "logprobs", "top_logprobs", "prompt_logprobs")
# `logprob_token_ids` asks for the logprobs of the tokens it lists at every output position, in
# place of the top ones (vLLM 0.32 takes up to 128): its length is an output logprobs width.
_TOKEN_IDS: Final = "logprob_token_ids"
_COUNTED: Final = frozenset((*_COUNTED_ORDER, _TOKEN_IDS))
_GRAMMARS: Final = frozenset((*GRAMMAR_FIELDS, "tool_choice"))


# With `echo` and no `prompt_logprobs`, vLLM 0.32 computes prompt logprobs at the width of
# the output logprobs: `top_logprobs` on chat, `logprobs` on completions.
_ECHOED: Final[Mapping[Endpoint, str]] = {"chat": "top_logprobs", "completions": "logprobs"}


@dataclass(frozen=True, slots=True)
class FieldPolicy:
    """One key's effective rules: the engine fields it may set and its bounds."""

    allow: frozenset[str] = frozenset()
    limits: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    # The per-sequence output bound, if any: read by every request, so looked up once here.
    max_tokens: int | None = field(init=False, default=None, repr=False, compare=False)

    @classmethod
    def merged(
        cls,
        profile_allow: tuple[str, ...],
        profile_limits: Mapping[str, int],
        key_allow: tuple[str, ...] = (),
        key_limits: Mapping[str, int] | None = None,
    ) -> FieldPolicy:
        limits = {**DEFAULT_LIMITS, **profile_limits, **(key_limits or {})}
        return cls(frozenset(profile_allow) | frozenset(key_allow), limits)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_tokens", self.limits.get("max_tokens"))


def check_fields(endpoint: Endpoint, data: Mapping[str, Any], policy: FieldPolicy) -> None:
    """Refuse a body that names a field the route does not have or the key may not set, or
    that exceeds one of the key's bounds."""
    open_fields = OPEN_FIELDS[endpoint]
    # Most bodies name only open fields and no bounded one: both found out by one set test each.
    if not open_fields.issuperset(data):
        for name in data:
            if name in open_fields:
                continue
            if name in ENGINE_FIELDS:
                if name in policy.allow:
                    continue
                raise Forbidden(f"this key may not set '{name}'", code="field_not_allowed")
            raise BadRequest(f"unsupported field '{name}' for this route", code="unsupported_field")
    limits = policy.limits
    if not _GRAMMARS.isdisjoint(data):
        _check_grammar(data, limits.get("grammar_bytes", DEFAULT_GRAMMAR_BYTES))
    if _COUNTED.isdisjoint(data):
        return
    for name in _COUNTED_ORDER:
        value = data.get(name)
        if value is None or name not in limits:
            continue
        if isinstance(value, bool):
            # vLLM reads `true` in a count as 1; chat's `logprobs` is a flag, not a count.
            if name == "logprobs" and endpoint != "completions":
                continue
            value = int(value)
        elif not isinstance(value, int):
            raise BadRequest(f"'{name}' must be an integer", code=f"invalid_{name}")
        _within(name, value, limits[name], "")
    echoed = _ECHOED.get(endpoint)
    if echoed is None:
        return
    if data.get(_TOKEN_IDS) is not None:
        _check_token_ids(data[_TOKEN_IDS], echoed, limits)
    if data.get("echo") is not None:
        _check_echo(data, echoed, limits)


def _check_grammar(data: Mapping[str, Any], bound: int) -> None:
    size = 0
    for name in GRAMMAR_FIELDS:
        value = data.get(name)
        if value is not None:
            size += len(orjson.dumps(value))
    if data.get("tools") and _forced(data.get("tool_choice")):
        size += len(orjson.dumps(data["tools"]))
    if size > bound:
        raise BadRequest(
            f"the output grammar asked for ({', '.join(GRAMMAR_FIELDS)}, forced tools) is "
            f"{size} bytes of JSON; this key may ask for at most {bound}",
            code="field_limit_exceeded",
        )


def _forced(choice: Any) -> bool:
    """Whether a `tool_choice` forces a tool call (compiled into a grammar): a name or a mode
    beyond auto and none, as a string (OpenAI) or an object's `type` (an OpenAI named tool is
    `function`; Anthropic's modes are objects)."""
    if choice is None:
        return False
    kind = choice.get("type") if isinstance(choice, dict) else choice
    return not isinstance(kind, str) or kind not in _UNFORCED


def _check_token_ids(ids: Any, width: str, limits: Mapping[str, int]) -> None:
    """The listed tokens' logprobs are output logprobs, at the width of `top_logprobs` (chat)
    or `logprobs` (completions): held to that field's bound."""
    if not isinstance(ids, list):
        raise BadRequest(f"'{_TOKEN_IDS}' must be an array of token ids", code=f"invalid_{_TOKEN_IDS}")
    if width in limits and len(ids) > limits[width]:
        raise BadRequest(
            f"'{_TOKEN_IDS}' lists {len(ids)} tokens, a logprobs width like '{width}'; this key "
            f"may ask for at most {limits[width]}",
            code="field_limit_exceeded",
        )


def _check_echo(data: Mapping[str, Any], source: str, limits: Mapping[str, int]) -> None:
    echo = data["echo"]
    if not isinstance(echo, bool):
        raise BadRequest("'echo' must be a boolean", code="invalid_echo")
    width = data.get(source)
    if not echo or data.get("prompt_logprobs") is not None or "prompt_logprobs" not in limits:
        return
    if isinstance(width, int):  # `true` included: vLLM reads it as 1
        _within("prompt_logprobs", int(width), limits["prompt_logprobs"], f" ('echo' with '{source}')")


def _within(name: str, value: int, bound: int, via: str) -> None:
    """A count above the bound is refused; so is a negative one, which vLLM reads as the
    whole vocabulary (-1) or refuses."""
    if value < 0:
        raise BadRequest(
            f"'{name}' is {value}{via}: a negative count asks for the whole vocabulary; this "
            f"key may ask for at most {bound}",
            code="field_limit_exceeded",
        )
    if value > bound:
        raise BadRequest(
            f"'{name}' is {value}{via}; this key may ask for at most {bound}",
            code="field_limit_exceeded",
        )


def unknown_names(names: tuple[str, ...]) -> list[str]:
    """Names that are neither a route's field nor an engine field (for config checks)."""
    known = ENGINE_FIELDS.union(*OPEN_FIELDS.values())
    return [n for n in names if n not in known]
