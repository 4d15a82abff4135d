"""The body-field allowlist: open fields pass, engine knobs need the key's leave, bounds hold."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.models import FieldRules, KeyConfig
from router.errors import BadRequest, Forbidden
from router.request.fields import (
    DEFAULT_LIMITS,
    ENGINE_FIELDS,
    OPEN_FIELDS,
    Endpoint,
    FieldPolicy,
    check_fields,
    unknown_names,
)

BASE: dict[Endpoint, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "embeddings": {"model": "m", "input": "hi"},
}
DEFAULT = FieldPolicy()


@pytest.mark.parametrize("endpoint", list(BASE))
def test_every_open_field_passes(endpoint: Endpoint) -> None:
    body = {**BASE[endpoint], **dict.fromkeys(OPEN_FIELDS[endpoint])}

    check_fields(endpoint, body, DEFAULT)


@pytest.mark.parametrize("endpoint", list(BASE))
@pytest.mark.parametrize("name", sorted(ENGINE_FIELDS))
def test_engine_fields_are_refused_unless_the_key_may_set_them(endpoint: Endpoint, name: str) -> None:
    body = {**BASE[endpoint], name: 1}
    with pytest.raises(Forbidden) as info:
        check_fields(endpoint, body, DEFAULT)

    assert info.value.code == "field_not_allowed"
    assert name in info.value.message
    check_fields(endpoint, body, FieldPolicy(allow=frozenset({name})))


@pytest.mark.parametrize(
    ("endpoint", "name"),
    [
        ("chat", "totally_new_knob"),
        ("completions", "max_completion_tokens"),  # not a completions field: vLLM would ignore it
        ("completions", "messages"),
        ("embeddings", "max_tokens"),
        ("chat", "guided_json"),  # removed from vLLM: it would be silently ignored
    ],
)
def test_fields_the_route_does_not_have_are_refused(endpoint: Endpoint, name: str) -> None:
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**BASE[endpoint], name: 1}, DEFAULT)

    assert info.value.code == "unsupported_field"


@pytest.mark.parametrize("name", sorted(DEFAULT_LIMITS))
def test_bounded_fields_are_refused_above_their_bound(name: str) -> None:
    endpoint: Endpoint = "completions" if name in ("best_of", "logprobs") else "chat"
    limit = DEFAULT_LIMITS[name]
    check_fields(endpoint, {**BASE[endpoint], name: limit}, DEFAULT)
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**BASE[endpoint], name: limit + 1}, DEFAULT)

    assert info.value.code == "field_limit_exceeded"


def test_chat_logprobs_is_a_flag_and_not_bounded() -> None:
    check_fields("chat", {**BASE["chat"], "logprobs": True, "top_logprobs": 3}, DEFAULT)


@pytest.mark.parametrize(
    ("endpoint", "fields"),
    [
        ("chat", {"echo": True, "logprobs": True, "top_logprobs": 20}),
        ("completions", {"echo": True, "logprobs": 5}),
    ],
)
def test_echo_asks_for_prompt_logprobs_at_the_output_width(
    endpoint: Endpoint, fields: dict[str, Any]
) -> None:
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**BASE[endpoint], **fields}, DEFAULT)
    assert info.value.code == "field_limit_exceeded" and "prompt_logprobs" in info.value.message
    # Without echo, or with prompt_logprobs stated within the bound, the same widths pass.
    check_fields(endpoint, {**BASE[endpoint], **fields, "echo": False}, DEFAULT)
    check_fields(endpoint, {**BASE[endpoint], **fields, "prompt_logprobs": 0}, DEFAULT)
    wide = FieldPolicy.merged((), {"prompt_logprobs": 20})
    check_fields(endpoint, {**BASE[endpoint], **fields}, wide)


@pytest.mark.parametrize("name", sorted(DEFAULT_LIMITS))
def test_a_negative_count_is_refused_whatever_the_bound(name: str) -> None:
    endpoint: Endpoint = "completions" if name in ("best_of", "logprobs") else "chat"
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**BASE[endpoint], name: -1}, DEFAULT)
    assert info.value.code == "field_limit_exceeded"


@pytest.mark.parametrize(
    ("endpoint", "fields"),
    [
        ("chat", {"prompt_logprobs": True}),
        ("completions", {"prompt_logprobs": True}),
        ("completions", {"echo": True, "logprobs": True}),
    ],
)
def test_true_is_a_count_of_one_where_vllm_reads_a_count(endpoint: Endpoint, fields: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**BASE[endpoint], **fields}, DEFAULT)
    assert info.value.code == "field_limit_exceeded"


def test_a_non_integer_bounded_field_is_refused() -> None:
    with pytest.raises(BadRequest):
        check_fields("chat", {**BASE["chat"], "n": "1000"}, DEFAULT)


def test_key_rules_add_to_the_profile_rules() -> None:
    policy = FieldPolicy.merged(("vllm_xargs",), {"n": 2}, ("chat_template",), {"n": 4, "max_tokens": 100})

    assert policy.allow == {"vllm_xargs", "chat_template"}
    assert policy.limits["n"] == 4
    assert policy.max_tokens == 100
    assert policy.limits["logprobs"] == DEFAULT_LIMITS["logprobs"]


def test_config_refuses_unknown_allow_names_and_limits() -> None:
    with pytest.raises(ValueError, match="not an engine field"):
        FieldRules(allow=("temperature",))
    with pytest.raises(ValueError, match="no bound for"):
        FieldRules(limits={"temperature": 1})
    with pytest.raises(ValueError, match="≥ 0"):
        KeyConfig(name="k", sha256_env="X", request_fields=FieldRules(limits={"n": -1}))


def test_unknown_names_lists_what_no_route_knows() -> None:
    assert unknown_names(("priority", "messages", "bogus")) == ["bogus"]


@pytest.mark.parametrize(("endpoint", "flag"), [("chat", True), ("completions", 1)])
def test_listed_logprob_tokens_are_held_to_the_logprobs_width(endpoint: Endpoint, flag: object) -> None:
    # vLLM returns the listed tokens' logprobs at every output position in place of the top ones.
    limit = DEFAULT_LIMITS["top_logprobs" if endpoint == "chat" else "logprobs"]
    body = {**BASE[endpoint], "logprobs": flag}
    check_fields(endpoint, {**body, "logprob_token_ids": list(range(limit))}, DEFAULT)
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**body, "logprob_token_ids": list(range(limit + 1))}, DEFAULT)
    assert info.value.code == "field_limit_exceeded" and "logprob_token_ids" in info.value.message
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**body, "logprob_token_ids": {"1": 2}}, DEFAULT)
    assert info.value.code == "invalid_logprob_token_ids"


def test_repetition_detection_is_an_engine_knob() -> None:
    # vLLM's scheduler loops over every pattern size up to max_pattern_size after each token.
    body = {
        **BASE["chat"],
        "repetition_detection": {"max_pattern_size": 1_000_000_000, "min_count": 2},
    }
    with pytest.raises(Forbidden) as info:
        check_fields("chat", body, DEFAULT)
    assert info.value.code == "field_not_allowed"
    check_fields("chat", body, FieldPolicy(allow=frozenset({"repetition_detection"})))


def _schema(properties: int) -> dict[str, Any]:
    props = {f"p{i}": {"type": "string", "pattern": "[a-z]{1,50}(x|y){2,20}"} for i in range(properties)}
    return {"type": "object", "properties": props, "required": list(props)}


@pytest.mark.parametrize(
    ("endpoint", "fields"),
    [
        (
            "chat",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": _schema(600)},
                }
            },
        ),
        ("completions", {"structured_outputs": {"json": _schema(600)}}),
        (
            "chat",
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": _schema(600)}}],
                "tool_choice": "required",
            },
        ),
    ],
    ids=["response_format", "structured_outputs", "forced-tools"],
)
def test_an_output_grammar_is_bounded_by_its_size(endpoint: Endpoint, fields: dict[str, Any]) -> None:
    # vLLM compiles it before generating: a 220 KiB schema takes some 20 s of CPU.
    with pytest.raises(BadRequest) as info:
        check_fields(endpoint, {**BASE[endpoint], **fields}, DEFAULT)
    assert info.value.code == "field_limit_exceeded" and "grammar" in info.value.message
    check_fields(endpoint, {**BASE[endpoint], **fields}, FieldPolicy.merged((), {"grammar_bytes": 1 << 20}))


def test_tools_the_model_may_leave_uncalled_are_no_grammar() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": _schema(600)}}]
    check_fields("chat", {**BASE["chat"], "tools": tools, "tool_choice": "auto"}, DEFAULT)
    check_fields("chat", {**BASE["chat"], "tools": tools}, DEFAULT)
