"""Classification: each class reached by its signal, in first-match order."""

from __future__ import annotations

from typing import Any

import pytest

from router.config import ClassifyConfig, KeyConfig, RequestClass
from router.config.models import RepeatedPrefix
from router.keys.auth import ApiKey, build_keys, hash_key
from router.lanes.classify import Classification, ClassifyRules, Reason, Signals, classify, parse_class_header
from router.request.facts import RequestFacts

CFG = ClassifyConfig(
    long_context_tokens=6000,
    batch_min_output_tokens=256,
    repeated_prefix=RepeatedPrefix(min_tokens=512, seen=2, window_s=600),
)

PLAIN_FIELDS: dict[str, Any] = {
    "endpoint": "chat",
    "model": "m",
    "stream": True,
    "max_tokens": 128,
    "sequences": 1,
    "has_tools": False,
    "roles": ("user",),
    "prompt_tokens": 200,
    "prefix_chain": (),
    "user": None,
    "include_usage": False,
    "body": {},
}


def plain(**changes: Any) -> RequestFacts:
    """The plain request's facts with `changes`."""
    return RequestFacts(**{**PLAIN_FIELDS, **changes})


PLAIN = plain()


def key(**fields: Any) -> ApiKey:
    (k,) = build_keys((KeyConfig(name="k", sha256=hash_key("s"), **fields),), {})
    return k


def run(facts: RequestFacts = PLAIN, k: ApiKey | None = None, **signals: Any) -> Classification:
    return classify(facts, k or key(), Signals(**signals), ClassifyRules.of(CFG))


def test_plain_streamed_chat_is_default_chat() -> None:
    assert run() == Classification(RequestClass.CHAT, Reason.DEFAULT)


def test_default_class_comes_from_config() -> None:
    cfg = ClassifyRules.of(ClassifyConfig(default_class=RequestClass.BATCH))

    assert classify(PLAIN, key(), Signals(), cfg) == Classification(RequestClass.BATCH, Reason.DEFAULT)


@pytest.mark.parametrize("cls", list(RequestClass))
def test_header_sets_the_class_when_the_key_may(cls: RequestClass) -> None:
    assert run(k=key(may_set_class=True), header_class=cls) == Classification(cls, Reason.HEADER)


def test_header_is_ignored_when_the_key_may_not_set_the_class() -> None:
    assert run(header_class=RequestClass.BATCH) == Classification(RequestClass.CHAT, Reason.DEFAULT)


def test_pinned_class() -> None:
    assert run(k=key(pin_class="batch")) == Classification(RequestClass.BATCH, Reason.PINNED)


def test_tools_make_an_agent() -> None:
    assert run(plain(has_tools=True)) == Classification(RequestClass.AGENT, Reason.TOOLS)


def test_long_prompt_makes_long_context_from_the_threshold_on() -> None:
    at = run(plain(prompt_tokens=6000))
    below = run(plain(prompt_tokens=5999))

    assert at == Classification(RequestClass.LONG_CONTEXT, Reason.LONG_PROMPT)
    assert below.reason is Reason.DEFAULT


def test_repeated_prefix_makes_rag_from_seen_on() -> None:
    assert run(prefix_seen=2) == Classification(RequestClass.RAG, Reason.REPEATED_PREFIX)
    assert run(prefix_seen=3).cls is RequestClass.RAG
    assert run(prefix_seen=1) == Classification(RequestClass.CHAT, Reason.DEFAULT)


def test_large_non_streamed_generation_makes_batch() -> None:
    at = run(plain(stream=False, max_tokens=256))

    assert at == Classification(RequestClass.BATCH, Reason.LARGE_GENERATION)
    assert run(plain(stream=False, max_tokens=255)).reason is Reason.DEFAULT
    assert run(plain(stream=False, max_tokens=None)).reason is Reason.DEFAULT


def test_an_unstated_bound_is_judged_by_the_written_one_with_its_sequences() -> None:
    unstated = plain(stream=False, max_tokens=None, sequences=8)

    assert run(unstated, output_tokens=8 * 2048) == Classification(
        RequestClass.BATCH, Reason.LARGE_GENERATION
    )
    assert run(unstated, output_tokens=255).reason is Reason.DEFAULT
    streamed = plain(stream=True, max_tokens=None, sequences=8)
    assert run(streamed, output_tokens=8 * 2048).reason is Reason.DEFAULT


def test_large_streamed_generation_is_not_batch() -> None:
    assert run(plain(stream=True, max_tokens=4096)).cls is RequestClass.CHAT


def test_slow_client_only_for_streams() -> None:
    assert run(slow_client=True) == Classification(RequestClass.SLOW_STREAM, Reason.SLOW_CLIENT)
    assert run(plain(stream=False), slow_client=True) == Classification(RequestClass.CHAT, Reason.DEFAULT)


# --- first match wins ---------------------------------------------------------------------------

EVERYTHING_FIELDS: dict[str, Any] = {
    "has_tools": True,
    "prompt_tokens": 9000,
    "stream": False,
    "max_tokens": 4096,
}
EVERYTHING = plain(**EVERYTHING_FIELDS)


def test_header_beats_a_pinned_key() -> None:
    k = key(may_set_class=True, pin_class="batch")

    assert run(EVERYTHING, k, header_class=RequestClass.RAG, prefix_seen=9) == Classification(
        RequestClass.RAG, Reason.HEADER
    )


def test_pinned_key_beats_tools() -> None:
    assert run(EVERYTHING, key(pin_class="chat"), prefix_seen=9) == Classification(
        RequestClass.CHAT, Reason.PINNED
    )


def test_tools_beat_long_prompt() -> None:
    assert run(EVERYTHING, prefix_seen=9).reason is Reason.TOOLS


def test_long_prompt_beats_repeated_prefix() -> None:
    facts = plain(**{**EVERYTHING_FIELDS, "has_tools": False})

    assert run(facts, prefix_seen=9).reason is Reason.LONG_PROMPT


def test_repeated_prefix_beats_large_non_streamed_generation() -> None:
    facts = plain(**{**EVERYTHING_FIELDS, "has_tools": False, "prompt_tokens": 1000})

    assert run(facts, prefix_seen=9).reason is Reason.REPEATED_PREFIX
    assert run(facts, prefix_seen=0).reason is Reason.LARGE_GENERATION


def test_repeated_prefix_beats_slow_client() -> None:
    assert run(prefix_seen=2, slow_client=True).reason is Reason.REPEATED_PREFIX


def test_slow_client_beats_default_but_not_large_generation_signals_of_a_stream() -> None:
    streamed_large = plain(stream=True, max_tokens=4096)

    assert run(streamed_large, slow_client=True).reason is Reason.SLOW_CLIENT


# --- X-Request-Class ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"rag", RequestClass.RAG),
        (b"  Long_Context ", RequestClass.LONG_CONTEXT),
        (b"SLOW_STREAM", RequestClass.SLOW_STREAM),
        (b"premium", None),
        (b"", None),
        (None, None),
        (b"\xff\xfe", None),
    ],
)
def test_parse_class_header(value: bytes | None, expected: RequestClass | None) -> None:
    assert parse_class_header(value) is expected
