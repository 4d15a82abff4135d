"""What the backend receives: the client's body, re-encoded, with what the router decides
written into it. Pure.

* The output bound. A request that states none would otherwise generate up to the context on
  chat; the router writes the lane's `max_output_tokens` (shared by the request's sequences),
  else the key's `max_tokens` bound, else the pool's context — so tpm charges, lane shapes and
  evidence all judge the bound vLLM will obey. On completions vLLM's own default (16) is the
  bound when nothing is stated, and it is written too. The bound goes into the field vLLM
  honours and the other output field is dropped (Responses: `max_output_tokens`; audio routes:
  `max_completion_tokens`, router.request.audiofacts).
* Anthropic's `max_tokens` is required, so it is a ceiling: the router writes its own bound, as
  for a request that states none, at most the ceiling; a thinking budget is written under it.
* `priority`, from the lane, on pools whose vLLM schedules by priority (the client's is
  replaced; on other pools vLLM refuses any non-zero priority).
* `cache_salt`, the key's, when the profile isolates prefix caches (the client's is replaced).
"""

from __future__ import annotations

from typing import Final

import orjson

from router.app.routes import NO_OUTPUT
from router.errors import BadRequest
from router.request.anthropic import thinking_within
from router.request.facts import RequestFacts

# vLLM 0.32's `CompletionRequest.max_tokens` default.
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16


class OutputCaps:
    """The bounds a request's output is held to. A compiled class: one C call compiled."""

    __slots__ = ("context", "key", "lane")

    def __init__(self, lane: int | None, key: int | None, context: int) -> None:
        self.lane: Final = lane  # the lane's max_output_tokens: all sequences of a request together
        self.key: Final = key  # the key's `max_tokens` bound: per sequence
        self.context: Final = context  # the pool's max_model_len


def output_bound(facts: RequestFacts, caps: OutputCaps) -> int | None:
    """The per-sequence output bound the backend will obey; None for routes without output.
    A stated bound must already be within the caps (`check_key_output`, and the lane's shape:
    router.lanes.admission.outside_lane_shape)."""
    if facts.endpoint in NO_OUTPUT:
        return None
    if facts.max_tokens is not None:
        return facts.max_tokens
    bound = _unstated_bound(facts, caps)
    if bound < 1:
        raise BadRequest(
            f"the request asks for {facts.sequences} outputs; its lane allows "
            f"{caps.lane} output tokens in all",
            code="max_tokens_exceeded",
        )
    return bound


def written_output(facts: RequestFacts, caps: OutputCaps) -> int | None:
    """All the output a request may make under these caps, its sequences together: the bound
    it states, else the one the router writes (at least one token a sequence); None for
    routes without output. What classification judges, rather than the stated bound alone."""
    if facts.endpoint in NO_OUTPUT:
        return None
    if facts.max_tokens is not None:
        return facts.max_tokens * facts.sequences
    return max(1, _unstated_bound(facts, caps)) * facts.sequences


def _unstated_bound(facts: RequestFacts, caps: OutputCaps) -> int:
    """The per-sequence bound written when the client states none (below 1: the lane's
    output does not cover one token a sequence)."""
    bound = COMPLETIONS_DEFAULT_MAX_TOKENS if facts.endpoint == "completions" else caps.context
    if caps.key is not None:
        bound = min(bound, caps.key)
    if caps.lane is not None:
        bound = min(bound, caps.lane // facts.sequences)
    ceiling = facts.output_ceiling
    if ceiling is not None:
        bound = min(bound, ceiling)
    return bound


def check_key_output(facts: RequestFacts, key_cap: int | None) -> None:
    """A stated per-sequence bound above the key's `max_tokens` limit is refused."""
    if key_cap is not None and facts.max_tokens is not None and facts.max_tokens > key_cap:
        raise BadRequest(
            f"max_tokens {facts.max_tokens} is more than this key may ask for ({key_cap})",
            code="field_limit_exceeded",
        )


def upstream_body(
    facts: RequestFacts, bound: int | None, priority: int | None, cache_salt: str | None
) -> bytes:
    body = dict(facts.body)
    if bound is not None:
        if facts.endpoint == "responses":
            body["max_output_tokens"] = bound
        elif facts.endpoint == "chat" and body.get("max_completion_tokens") is not None:
            body["max_completion_tokens"] = bound
            body.pop("max_tokens", None)
        else:
            body["max_tokens"] = bound
            body.pop("max_completion_tokens", None)
    if facts.endpoint == "messages" and bound is not None:
        thinking_within(body, bound)
    if priority is not None:
        body["priority"] = priority
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return orjson.dumps(body)
