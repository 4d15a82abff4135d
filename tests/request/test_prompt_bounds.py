"""A request's cost is what it asks for: sequences, media, tools and any script are counted."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.config import ClassifyConfig, KeyConfig, RequestClass
from router.errors import BadRequest
from router.keys.auth import build_keys, hash_key
from router.lanes.classify import ClassifyRules, Signals, classify
from router.request.facts import Endpoint, RequestFacts, parse_facts
from router.request.tokens import PromptCosts, make_counter

COSTS = PromptCosts()
COUNTER = make_counter(None, COSTS)


def facts(body: dict[str, Any], endpoint: Endpoint = "chat") -> RequestFacts:
    return parse_facts(endpoint, orjson.dumps({"model": "m", **body}), COUNTER)


def user(content: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}]}


@pytest.mark.parametrize(
    "fields",
    [
        {"chat_template_kwargs": {"documents": [{"title": "t", "text": "x" * 1_000_000}]}},
        {"chat_template_kwargs": {"custom_tools": [{"name": "f", "description": "x" * 500_000}]}},
        {"documents": [{"title": "t", "text": "x" * 1_000_000}]},
        {"chat_template": "x" * 1_000_000},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "description": "x" * 500_000},
            }
        },
    ],
    ids=["kwargs-documents", "kwargs-custom-tools", "documents", "chat-template", "response-format"],
)
def test_what_the_chat_template_renders_counts_whole(fields: dict[str, Any]) -> None:
    size = len(orjson.dumps(fields))
    assert facts({**user("hi"), **fields}).prompt_tokens >= size


def test_tools_count_at_their_widest_rendering() -> None:
    import json

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"enum": [[1]] * 200}}}]
    plain = facts(user("hi")).prompt_tokens
    rendered = len(json.dumps(tools, indent=4, ensure_ascii=False))
    assert facts({**user("hi"), "tools": tools}).prompt_tokens - plain >= rendered + COSTS.tools
    assert facts({**user("hi"), "tools": tools}).prompt_tokens - plain >= len(str(tools))


def test_n_multiplies_the_output() -> None:
    f = facts({**user("hi"), "n": 8, "max_tokens": 200})

    assert (f.sequences, f.output_tokens) == (8, 1600)


def test_each_completions_prompt_is_a_sequence_and_best_of_counts() -> None:
    f = facts({"prompt": ["a", "b", "c"], "n": 2, "best_of": 4, "max_tokens": 10}, "completions")

    assert f.sequences == 3 * 4
    assert f.output_tokens == 120


def test_completions_ignore_max_completion_tokens_for_the_bound() -> None:
    f = facts({"prompt": "x", "max_tokens": 100000, "max_completion_tokens": 5}, "completions")

    assert f.max_tokens == 100000


def test_a_thousand_sequences_make_a_non_streamed_chat_a_batch() -> None:
    (key,) = build_keys((KeyConfig(name="k", sha256=hash_key("k")),), {})
    f = facts({**user("hi"), "n": 1000, "max_tokens": 200})

    assert classify(f, key, Signals(), ClassifyRules.of(ClassifyConfig())).cls is RequestClass.BATCH


@pytest.mark.parametrize(
    ("part", "cost"),
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, COSTS.image),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, COSTS.audio),
        ({"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}, COSTS.video),
    ],
    ids=["image", "audio", "video"],
)
def test_media_parts_cost_their_placeholder_tokens(part: dict[str, Any], cost: int) -> None:
    text_only = facts(user([{"type": "text", "text": "look"}])).prompt_tokens
    with_media = facts(user([{"type": "text", "text": "look"}, part, part])).prompt_tokens

    assert with_media - text_only == 2 * cost


@pytest.mark.parametrize("kind", ["image_embeds", "prompt_embeds", "audio_embeds", "file", "mystery"])
def test_content_parts_that_cannot_be_counted_are_refused(kind: str) -> None:
    with pytest.raises(BadRequest):
        facts(user([{"type": kind, kind: "AAAA"}]))


def test_tool_definitions_and_documents_count() -> None:
    plain = facts(user("hi")).prompt_tokens
    tool = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    tools = facts({**user("hi"), "tools": [tool] * 10}).prompt_tokens
    docs = facts({**user("hi"), "documents": [{"title": "t", "text": "x" * 1000}]}).prompt_tokens

    assert tools - plain >= COSTS.tools + len(orjson.dumps([tool] * 10))
    assert docs - plain >= 1000


@pytest.mark.parametrize(
    ("text", "at_least"),
    [("漢" * 7000, 21000), ("😀" * 2000, 8000), ("e\u0301" * 2000, 6000)],
    ids=["cjk", "emoji", "combining"],
)
def test_no_script_makes_a_long_prompt_short(text: str, at_least: int) -> None:
    f = facts(user(text))

    assert f.prompt_tokens >= at_least
    (key,) = build_keys((KeyConfig(name="k", sha256=hash_key("k")),), {})
    cfg = ClassifyConfig(long_context_tokens=6000)
    assert classify(f, key, Signals(), ClassifyRules.of(cfg)).cls is RequestClass.LONG_CONTEXT


def test_names_and_tool_call_ids_count() -> None:
    bare = facts({"messages": [{"role": "tool", "content": "42"}]}).prompt_tokens
    named = facts({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c" * 300}]}).prompt_tokens

    assert named - bare == 300
