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


class Classification:
    """A request's class and why. A compiled class, built with keywords: one C call compiled (a
    named tuple is built through Python's tuple constructor)."""

    __slots__ = ("cls", "reason")

    def __init__(self, cls: RequestClass, reason: Reason) -> None:
        self.cls: Final = cls
        self.reason: Final = reason

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Classification) and self.cls is other.cls and self.reason is other.reason

    def __hash__(self) -> int:
        return hash((self.cls, self.reason))

    def __repr__(self) -> str:
        return f"Classification(cls={self.cls!r}, reason={self.reason!r})"


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
            long_context_tokens=cfg.long_context_tokens,
            batch_min_output_tokens=cfg.batch_min_output_tokens,
            repeated_prefix_seen=rp.seen,
            repeated_prefix_tokens=rp.min_tokens,
            default_class=cfg.default_class,
        )


class Signals:
    """What the caller observed beside the body."""

    __slots__ = ("header_class", "output_tokens", "prefix_seen", "slow_client")

    def __init__(
        self,
        header_class: RequestClass | None = None,
        prefix_seen: int = 0,
        slow_client: bool = False,
        output_tokens: int | None = None,
    ) -> None:
        self.header_class: Final = header_class
        self.prefix_seen: Final = prefix_seen
        self.slow_client: Final = slow_client
        # All the output the request may make in the default class's lane: the bound the router
        # writes there when the body states none (router.request.rewrite.written_output). None: only the
        # stated bound is known.
        self.output_tokens: Final = output_tokens


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
        return Classification(cls=signals.header_class, reason=Reason.HEADER)
    if key.pin_class is not None:
        return Classification(cls=key.pin_class, reason=Reason.PINNED)
    if facts.has_tools:
        return Classification(cls=RequestClass.AGENT, reason=Reason.TOOLS)
    if facts.prompt_tokens >= long_context:
        return Classification(cls=RequestClass.LONG_CONTEXT, reason=Reason.LONG_PROMPT)
    if signals.prefix_seen >= prefix_seen:
        return Classification(cls=RequestClass.RAG, reason=Reason.REPEATED_PREFIX)
    # A request that states no bound is judged by the one the router writes for it, so leaving
    # the bound out cannot keep a large generation out of the batch class.
    total = signals.output_tokens
    if total is None and facts.max_tokens is not None:
        total = facts.max_tokens * facts.sequences
    if not facts.stream and total is not None and total >= batch_min_output:
        return Classification(cls=RequestClass.BATCH, reason=Reason.LARGE_GENERATION)
    if facts.stream and signals.slow_client:
        return Classification(cls=RequestClass.SLOW_STREAM, reason=Reason.SLOW_CLIENT)
    return Classification(cls=default_class, reason=Reason.DEFAULT)
