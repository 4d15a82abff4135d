"""What the backend receives: the written output bound, priority and cache salt."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.errors import BadRequest
from router.request.facts import Endpoint, RequestFacts, parse_facts
from router.request.rewrite import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    OutputCaps,
    check_key_output,
    output_bound,
    upstream_body,
    written_output,
)
from router.request.tokens import make_counter

COUNTER = make_counter(None)
MSGS = [{"role": "user", "content": "hi"}]


def facts(endpoint: Endpoint = "chat", **body: Any) -> RequestFacts:
    base: dict[str, Any] = {"model": "m"}
    base.update({"messages": MSGS} if endpoint == "chat" else {"prompt": "hi", "input": "hi"})
    if endpoint == "embeddings":
        base.pop("prompt")
    elif endpoint == "completions":
        base.pop("input")
    return parse_facts(endpoint, orjson.dumps({**base, **body}), COUNTER)


def sent(f: RequestFacts, caps: OutputCaps, priority: int | None = None, salt: str | None = None) -> Any:
    return orjson.loads(upstream_body(f, output_bound(f, caps), priority, salt))


NO_CAPS = OutputCaps(lane=None, key=None, context=8192)


def test_a_stated_bound_is_sent_as_stated() -> None:
    assert sent(facts(max_tokens=50), NO_CAPS)["max_tokens"] == 50


def test_chat_without_a_bound_gets_the_lane_share_the_key_bound_or_the_context() -> None:
    assert sent(facts(), NO_CAPS)["max_tokens"] == 8192
    assert sent(facts(), OutputCaps(lane=None, key=300, context=8192))["max_tokens"] == 300
    assert sent(facts(), OutputCaps(lane=512, key=None, context=8192))["max_tokens"] == 512
    assert sent(facts(n=4), OutputCaps(lane=512, key=None, context=8192))["max_tokens"] == 128


def test_the_written_output_is_the_bound_sent_times_the_sequences() -> None:
    for f, caps in [
        (facts(n=8), NO_CAPS),
        (facts(n=4), OutputCaps(lane=512, key=None, context=8192)),
        (facts(max_tokens=50, n=3), NO_CAPS),
        (facts("completions", best_of=5), NO_CAPS),
    ]:
        bound = sent(f, caps)["max_tokens"]
        assert written_output(f, caps) == bound * f.sequences
    assert written_output(facts(n=8), NO_CAPS) == 8 * 8192
    assert written_output(facts("embeddings"), NO_CAPS) is None


def test_more_sequences_than_the_lane_has_tokens_is_refused() -> None:
    with pytest.raises(BadRequest):
        output_bound(facts(n=8), OutputCaps(lane=4, key=None, context=8192))


def test_completions_without_a_bound_get_vllms_default_written() -> None:
    body = sent(facts("completions"), NO_CAPS)

    assert body["max_tokens"] == COMPLETIONS_DEFAULT_MAX_TOKENS


def test_chat_with_both_fields_keeps_only_the_one_vllm_honours() -> None:
    body = sent(facts(max_tokens=100000, max_completion_tokens=5), NO_CAPS)

    assert body["max_completion_tokens"] == 5
    assert "max_tokens" not in body


def test_chat_with_max_tokens_and_a_null_max_completion_tokens_keeps_max_tokens() -> None:
    body = sent(facts(max_tokens=7, max_completion_tokens=None), NO_CAPS)

    assert body["max_tokens"] == 7
    assert "max_completion_tokens" not in body


def test_embeddings_get_no_output_field() -> None:
    assert "max_tokens" not in sent(facts("embeddings"), NO_CAPS)


def test_priority_and_salt_replace_the_clients() -> None:
    body = sent(facts(priority=-100, cache_salt="mine"), NO_CAPS, priority=3, salt="s" * 64)

    assert (body["priority"], body["cache_salt"]) == (3, "s" * 64)


def test_without_policy_the_clients_fields_are_sent_unchanged() -> None:
    body = sent(facts(max_tokens=9, temperature=0.5, stop=["x"]), NO_CAPS)

    assert body == {"model": "m", "messages": MSGS, "max_tokens": 9, "temperature": 0.5, "stop": ["x"]}


def test_a_stated_bound_above_the_keys_limit_is_refused() -> None:
    check_key_output(facts(max_tokens=100), 100)
    with pytest.raises(BadRequest):
        check_key_output(facts(max_tokens=101), 100)
    with pytest.raises(BadRequest):
        check_key_output(facts(max_completion_tokens=101), 100)
