"""Anthropic Messages bodies: read into the facts the router judges, counted as the chat request
vLLM builds from them, refused where vLLM's request would read them otherwise."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from router.errors import BadRequest, Forbidden
from router.request.anthropic import parse_messages
from router.request.facts import Endpoint, RequestFacts, parse_facts
from router.request.fields import FieldPolicy, check_fields
from router.request.rewrite import OutputCaps, output_bound, upstream_body, written_output
from router.request.tokens import PromptCosts, make_counter

# The upper bound (a token per UTF-8 byte): what the router counts without a tokenizer.
COSTS = PromptCosts()
COUNTER = make_counter(None, COSTS)
HI = [{"role": "user", "content": "hi"}]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, "messages": HI, **fields}


def facts(data: dict[str, Any], endpoint: Endpoint = "messages") -> RequestFacts:
    return parse_messages(endpoint, orjson.dumps(data), COUNTER)


def tokens(**fields: Any) -> int:
    return facts(body(**fields)).prompt_tokens


def refused(data: dict[str, Any], endpoint: Endpoint = "messages") -> BadRequest:
    with pytest.raises(BadRequest) as info:
        facts(data, endpoint)
    assert info.value.status == 400
    return info.value


def chat_tokens(messages: list[dict[str, Any]], **fields: Any) -> int:
    return parse_facts(
        "chat", orjson.dumps({"model": "m", "messages": messages, **fields}), COUNTER
    ).prompt_tokens


# --- the prompt bound ----------------------------------------------------------------------------


def test_system_and_text_count_as_the_chat_request_vllm_builds() -> None:
    system = "You answer in French."
    anthropic = tokens(system=system, messages=[*HI, {"role": "assistant", "content": "salut"}])
    as_chat = chat_tokens(
        [{"role": "system", "content": system}, *HI, {"role": "assistant", "content": "salut"}]
    )
    assert anthropic == as_chat


def test_system_blocks_count_their_texts() -> None:
    blocks = [{"type": "text", "text": "one "}, {"type": "text", "text": "two", "cache_control": {}}]
    assert tokens(system=blocks) == tokens(system="one two")


def test_text_blocks_count_as_text() -> None:
    blocks = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert tokens(messages=blocks) == tokens()


def test_an_image_costs_the_profiles_image_tokens() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with_image = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]
    twice = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image, image]}]
    assert tokens(messages=with_image) == tokens() + COSTS.image
    assert tokens(messages=twice) == tokens() + 2 * COSTS.image


def test_a_tool_use_counts_its_input_as_the_json_vllm_writes() -> None:
    # vLLM writes the arguments with ASCII escapes: six bytes for a three-byte character.
    arguments = {"city": "東京" * 50}
    call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": arguments}
    bare = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    turn = [*HI, {"role": "assistant", "content": [call]}]
    bare_turn = [*HI, {"role": "assistant", "content": [bare]}]
    grown = tokens(messages=turn) - tokens(messages=bare_turn)
    assert grown == len(json.dumps(arguments)) - len(json.dumps({}))
    assert grown > len(orjson.dumps(arguments))  # more than its UTF-8 bytes
    assert facts(body(messages=turn)).has_tools


def test_a_tool_result_counts_its_text_and_images() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}}
    text = "sunny " * 40
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": text}
    blocks = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": text}, image],
    }
    as_string = tokens(messages=[{"role": "user", "content": [result]}])
    as_blocks = tokens(messages=[{"role": "user", "content": [blocks]}])
    assert as_string >= len(text)
    # The image goes into a user message of its own.
    assert as_blocks == as_string + COSTS.per_message + len("user") + COSTS.image
    assert facts(body(messages=[{"role": "user", "content": [result]}])).has_tools


def test_an_assistants_tool_result_counts_the_text_vllm_makes_of_it() -> None:
    content = [{"type": "text", "text": "é" * 30}]
    result = {"type": "tool_result", "tool_use_id": "t", "content": content}
    empty = {"type": "tool_result", "tool_use_id": "t", "content": ""}
    grown = tokens(messages=[{"role": "assistant", "content": [result]}]) - tokens(
        messages=[{"role": "assistant", "content": [empty]}]
    )
    assert grown == len(str(content).encode())


def test_tools_count_their_definitions_and_the_tool_cost() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "description": "x" * 300}}}
    tool = {"name": "search", "description": "d" * 200, "input_schema": schema}
    grown = tokens(tools=[tool]) - tokens()
    assert grown >= COSTS.tools + 500
    assert facts(body(tools=[tool])).has_tools
    # A tool a system message adds by value counts as a declared one.
    change = {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": tool}}
    added = [{"role": "system", "content": [change]}, *HI]
    assert tokens(messages=added) >= tokens() + COSTS.tools + 500


def test_output_config_and_template_kwargs_count() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "description": "y" * 400}
    assert tokens(output_config={"format": {"type": "json_schema", "schema": schema}}) > tokens() + 400
    assert tokens(chat_template_kwargs={"notes": "z" * 300}) > tokens() + 300


def test_count_tokens_bounds_its_prompt_as_messages_does() -> None:
    data = body(system="s" * 100, tools=[{"name": "f", "input_schema": {}}])
    counted = facts({k: v for k, v in data.items() if k != "max_tokens"}, "count_tokens")
    assert counted.prompt_tokens == facts(data).prompt_tokens
    assert counted.output_ceiling is None and not counted.stream


# --- the output bound ----------------------------------------------------------------------------


def test_max_tokens_is_a_ceiling_under_the_lanes_and_the_keys_bounds() -> None:
    f = facts(body(max_tokens=32_000))
    assert f.max_tokens is None and f.output_ceiling == 32_000
    assert output_bound(f, OutputCaps(lane=None, key=None, context=8192)) == 8192
    assert output_bound(f, OutputCaps(lane=512, key=None, context=8192)) == 512
    assert output_bound(f, OutputCaps(lane=None, key=300, context=8192)) == 300
    small = facts(body(max_tokens=50))
    assert output_bound(small, OutputCaps(lane=512, key=300, context=8192)) == 50
    assert written_output(small, OutputCaps(lane=512, key=None, context=8192)) == 50
    sent = orjson.loads(upstream_body(f, 512, None, None))
    assert sent["max_tokens"] == 512 and "max_completion_tokens" not in sent


def test_a_thinking_budget_is_written_under_the_bound() -> None:
    f = facts(body(max_tokens=32_000, thinking={"type": "enabled", "budget_tokens": 16_000}))
    assert orjson.loads(upstream_body(f, 4096, None, None))["thinking"] == {
        "type": "enabled",
        "budget_tokens": 4095,
    }
    assert orjson.loads(upstream_body(f, 20_000, None, None))["thinking"]["budget_tokens"] == 16_000
    with pytest.raises(BadRequest):
        upstream_body(f, 1024, None, None)
    assert f.body["thinking"]["budget_tokens"] == 16_000  # the client's body is not changed


def test_count_tokens_has_no_output() -> None:
    data = {"model": "m", "messages": HI}
    assert output_bound(facts(data, "count_tokens"), OutputCaps(lane=8, key=None, context=8192)) is None
    assert orjson.loads(upstream_body(facts(data, "count_tokens"), None, None, None)) == data


@pytest.mark.parametrize("value", [None, 0, -1, "5", 5.0, True])
def test_max_tokens_is_required_and_a_positive_integer(value: Any) -> None:
    data = body(max_tokens=value) if value is not None else {"model": "m", "messages": HI}
    assert refused(data).code == "invalid_max_tokens"


# --- the field policy ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["priority", "n", "max_completion_tokens", "unknown", "request_id"])
def test_fields_vllms_request_does_not_read_are_refused(name: str) -> None:
    assert refused(body(**{name: 1})).code == "unsupported_field"


def test_count_tokens_takes_only_its_own_fields() -> None:
    assert refused(body(), "count_tokens").code == "unsupported_field"  # max_tokens
    assert refused({"model": "m", "messages": HI, "stream": True}, "count_tokens").code == "unsupported_field"


def test_engine_fields_need_the_keys_allowance() -> None:
    data = body(cache_salt="mine")
    f = facts(data)
    with pytest.raises(Forbidden):
        check_fields("messages", f.body, FieldPolicy())
    check_fields("messages", f.body, FieldPolicy(allow=frozenset({"cache_salt"})))


def test_a_forced_tool_and_an_output_schema_are_bounded_grammars() -> None:
    tool = {"name": "f", "input_schema": {"type": "object", "description": "x" * 40_000}}
    forced = body(tools=[tool], tool_choice={"type": "any"})
    with pytest.raises(BadRequest) as info:
        check_fields("messages", facts(forced).body, FieldPolicy())
    assert info.value.code == "field_limit_exceeded"
    check_fields("messages", facts(body(tools=[tool], tool_choice={"type": "auto"})).body, FieldPolicy())
    schema = {"type": "object", "description": "x" * 40_000}
    big = body(output_config={"format": {"type": "json_schema", "schema": schema}})
    with pytest.raises(BadRequest):
        check_fields("messages", facts(big).body, FieldPolicy())


def test_a_named_tool_choice_on_chat_is_judged_not_crashed_on() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    choice = {"type": "function", "function": {"name": "f"}}
    check_fields(
        "chat", {"model": "m", "messages": HI, "tools": [tool], "tool_choice": choice}, FieldPolicy()
    )


# --- bodies vLLM would read otherwise ------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"stream": "true"},
        {"stream": 1},
        {"temperature": "0.5"},
        {"top_k": 1.5},
        {"stop_sequences": "END"},
        {"system": 5},
        {"system": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}]},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_use", "input": "{}"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": 5}]}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "content": [{"type": "text", "text": 1}]}],
                }
            ]
        },
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference"}}]}
            ]
        },
        {"tools": {"name": "f"}},
        {"tools": [{"name": "f"}]},
        {"tools": [{"name": "f", "input_schema": {}, "strict": "yes"}]},
        {"tool_choice": "auto"},
        {"tool_choice": {"type": "tool"}},
        {"thinking": {"type": "enabled", "budget_tokens": 100}},
        {"thinking": {"type": "enabled", "budget_tokens": "2048"}},
        {"output_config": {"effort": "extreme"}},
        {"model": ""},
    ],
)
def test_bodies_vllm_would_read_otherwise_are_refused(fields: dict[str, Any]) -> None:
    refused(body(**fields))


def test_metadata_user_id_is_the_user() -> None:
    assert facts(body(metadata={"user_id": "u-1"})).user == "u-1"
    assert facts(body()).user is None
