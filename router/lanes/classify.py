"""Which of the six classes a request belongs to, and why. Pure: everything stateful (the
repeated-prefix count, the slow-client memory) is looked up by the caller and passed in."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final, NamedTuple

from router.config.models import ClassifyConfig, RequestClass
from router.keys.auth import ApiKey
from router.request.facts import RequestFacts


class Reason(StrEnum):
    HEADER = "header"
    PINNED = "pinned_key"
    TOOLS = "tools"
    LONG_PROMPT = "long_prompt"
    REPEATED_PREFIX = "repeated_prefix"
    LARGE_GENERATION = "large_generation"
    SLOW_CLIENT = "slow_client"
    DEFAULT = "default"
    CONVERSATION = "previous_response"


# A reason's text, looked up without the enum's `value` property (two Python calls).
REASON_TEXT: Final[Mapping[Reason, str]] = MappingProxyType({r: r.value for r in Reason})


# Named tuples: immutable values that cost a request no more than a tuple each; the request path
# builds them with the tuple constructor (`_new`), as a named tuple's own `__new__` is a Python
# function.
_new: Final = tuple.__new__


class Classification(NamedTuple):
    cls: RequestClass
    reason: Reason


class ClassifyRules(NamedTuple):
    """A profile's `classify` settings as plain values, read without a validated model's
    attribute lookups: built once per runtime."""

    long_context_tokens: int
    batch_min_output_tokens: int
    repeated_prefix_seen: int
    repeated_prefix_tokens: int
    default_class: RequestClass

    @classmethod
    def of(cls, cfg: ClassifyConfig) -> ClassifyRules:
        rp = cfg.repeated_prefix
        return cls(
            cfg.long_context_tokens, cfg.batch_min_output_tokens, rp.seen, rp.min_tokens, cfg.default_class
        )


class Signals(NamedTuple):
    """What the caller observed beside the body."""

    header_class: RequestClass | None = None
    prefix_seen: int = 0
    slow_client: bool = False
    # All the output the request may make in the default class's lane: the bound the router
    # writes there when the body states none (router.request.rewrite.written_output). None: only the
    # stated bound is known.
    output_tokens: int | None = None


def parse_class_header(value: bytes | None) -> RequestClass | None:
    """An unknown class name in `X-Request-Class` is ignored like an absent header."""
    if not value:
        return None
    try:
        return RequestClass(value.decode("latin-1").strip().lower())
    except ValueError:
        return None


def classify(facts: RequestFacts, key: ApiKey, signals: Signals, rules: ClassifyRules) -> Classification:
    long_context, batch_min_output, prefix_seen, _, default_class = rules
    if signals.header_class is not None and key.may_set_class:
        return _new(Classification, (signals.header_class, Reason.HEADER))
    if key.pin_class is not None:
        return _new(Classification, (key.pin_class, Reason.PINNED))
    if facts.has_tools:
        return _new(Classification, (RequestClass.AGENT, Reason.TOOLS))
    if facts.prompt_tokens >= long_context:
        return _new(Classification, (RequestClass.LONG_CONTEXT, Reason.LONG_PROMPT))
    if signals.prefix_seen >= prefix_seen:
        return _new(Classification, (RequestClass.RAG, Reason.REPEATED_PREFIX))
    # A request that states no bound is judged by the one the router writes for it, so leaving
    # the bound out cannot keep a large generation out of the batch class.
    total = signals.output_tokens
    if total is None and facts.max_tokens is not None:
        total = facts.max_tokens * facts.sequences
    if not facts.stream and total is not None and total >= batch_min_output:
        return _new(Classification, (RequestClass.BATCH, Reason.LARGE_GENERATION))
    if facts.stream and signals.slow_client:
        return _new(Classification, (RequestClass.SLOW_STREAM, Reason.SLOW_CLIENT))
    return _new(Classification, (default_class, Reason.DEFAULT))
