"""Request facts: one pass over the body; bad input is a BadRequest before anything is forwarded."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.errors import BadRequest
from router.request.facts import PREFIX_BLOCK_CHARS, Endpoint, RequestFacts, parse_facts, prefix_chain
from router.request.tokens import SimulatorCounter

# The simulator's rule (4 characters a token, no template) keeps these counts readable; the
# upper-bound counter has tests of its own (tests/request/test_prompt_bounds.py).
COUNTER = SimulatorCounter()


def facts(body: dict[str, Any], endpoint: Endpoint = "chat") -> RequestFacts:
    return parse_facts(endpoint, orjson.dumps(body), COUNTER)


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def bad_request(endpoint: Endpoint, body: bytes) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        parse_facts(endpoint, body, COUNTER)
    assert info.value.status == 400
    return info.value


# --- well-formed bodies -------------------------------------------------------------------------


def test_chat_body() -> None:
    f = facts(
        chat(
            {"role": "system", "content": "be brief"},
            user("hello"),
            model="org/chat",
            stream=True,
            max_tokens=64,
            user="u-1",
            stream_options={"include_usage": True},
        )
    )

    assert f.endpoint == "chat"
    assert f.model == "org/chat"
    assert f.stream is True
    assert f.max_tokens == 64
    assert f.roles == ("system", "user")
    assert f.has_tools is False
    assert f.user == "u-1"
    assert f.include_usage is True
    assert f.prompt_tokens > 0


def test_chat_defaults() -> None:
    f = facts(chat(user("hi")))

    assert (f.stream, f.max_tokens, f.user, f.include_usage) == (False, None, None, False)


def test_stream_null_means_not_streamed() -> None:
    assert facts(chat(user("hi"), stream=None)).stream is False


def test_max_completion_tokens_is_read() -> None:
    assert facts(chat(user("hi"), max_completion_tokens=99)).max_tokens == 99


def test_content_as_parts_counts_their_text() -> None:
    text = "word " * 200
    parts = facts(chat({"role": "user", "content": [{"type": "text", "text": text}]}))
    plain = facts(chat(user(text)))

    assert parts.prompt_tokens == plain.prompt_tokens


def test_null_content_is_allowed() -> None:
    f = facts(chat({"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}, user("go")))

    assert f.roles == ("assistant", "user")


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        ("abcd" * 10, 10),
        (["abcd" * 10, "abcd" * 5], 15),
        ([1, 2, 3, 4, 5], 5),
        ([[1, 2, 3], [4, 5]], 5),
    ],
)
def test_completions_prompt_forms(prompt: Any, tokens: int) -> None:
    f = facts({"model": "m", "prompt": prompt, "max_tokens": 5}, "completions")

    assert f.endpoint == "completions"
    assert f.prompt_tokens == tokens
    assert f.roles == ()
    assert f.max_tokens == 5


def test_embeddings_body() -> None:
    f = facts({"model": "e", "input": ["first text", "second"]}, "embeddings")

    assert (f.endpoint, f.model, f.stream) == ("embeddings", "e", False)
    assert f.prompt_tokens == COUNTER.text("first text") + COUNTER.text("second")


def test_embeddings_read_input_not_prompt() -> None:
    bad_request("embeddings", orjson.dumps({"model": "e", "prompt": "x"}))


# --- malformed bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"not json", b'{"model": "m",}', b"\xff\xfe{}", b'{"model": "\xc3\x28"}', b'"\\ud800"'],
    ids=["empty", "truncated", "text", "trailing-comma", "bad-utf8", "bad-utf8-in-string", "lone-surrogate"],
)
def test_malformed_or_non_utf8_json_is_a_bad_request(body: bytes) -> None:
    assert bad_request("chat", body).code == "invalid_json"


@pytest.mark.parametrize("body", [b"[]", b"1", b'"text"', b"null"])
def test_non_object_body_is_a_bad_request(body: bytes) -> None:
    assert bad_request("chat", body).code == "invalid_json"


VALID = chat(user("hi"))

BAD_FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("missing model", {"model": None}),
    ("empty model", {"model": ""}),
    ("model not a string", {"model": 7}),
    ("stream 'yes'", {"stream": "yes"}),
    ("stream 1", {"stream": 1}),
    ("max_tokens '10'", {"max_tokens": "10"}),
    ("max_tokens 0", {"max_tokens": 0}),
    ("max_tokens negative", {"max_tokens": -3}),
    ("max_tokens true", {"max_tokens": True}),
    ("max_tokens float", {"max_tokens": 1.5}),
    ("max_completion_tokens 0", {"max_completion_tokens": 0}),
    ("messages not a list", {"messages": {"role": "user", "content": "hi"}}),
    ("messages empty", {"messages": []}),
    ("message not an object", {"messages": ["hi"]}),
    ("role unknown", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("role missing", {"messages": [{"content": "hi"}]}),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}),
    ("content an object", {"messages": [{"role": "user", "content": {"text": "hi"}}]}),
    ("content part not an object", {"messages": [{"role": "user", "content": ["hi"]}]}),
    ("tools not a list", {"tools": {"type": "function"}}),
    ("stream_options not an object", {"stream_options": True}),
    ("user not a string", {"user": 42}),
]


@pytest.mark.parametrize("change", [c for _, c in BAD_FIELDS], ids=[name for name, _ in BAD_FIELDS])
def test_wrong_field_is_a_bad_request(change: dict[str, Any]) -> None:
    body = {**VALID, **change}
    body = {k: v for k, v in body.items() if not (k == "model" and v is None)}

    bad_request("chat", orjson.dumps(body))


def test_an_invalid_max_tokens_is_refused_even_beside_a_valid_max_completion_tokens() -> None:
    body = {**VALID, "max_completion_tokens": 5, "max_tokens": "10"}

    bad_request("chat", orjson.dumps(body))


@pytest.mark.parametrize(
    "prompt",
    [None, 5, [], [1, "a"], [["a"]], {"text": "x"}],
    ids=["missing", "int", "empty", "mixed", "nested", "obj"],
)
def test_completions_prompt_of_wrong_shape_is_a_bad_request(prompt: Any) -> None:
    body = {"model": "m"} if prompt is None else {"model": "m", "prompt": prompt}

    bad_request("completions", orjson.dumps(body))


# --- tools --------------------------------------------------------------------------------------


TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chat(user("hi"), tools=[TOOL]), True),
        (chat(user("hi"), tools=[]), False),
        (chat(user("hi"), tools=None), False),
        (chat(user("hi"), {"role": "tool", "content": "42", "tool_call_id": "1"}), True),
        (chat(user("hi"), {"role": "function", "content": "42", "name": "f"}), True),
        (chat(user("hi"), {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}), True),
        (chat(user("hi"), {"role": "assistant", "content": "ok", "tool_calls": []}), False),
        (chat(user("hi"), {"role": "assistant", "content": "ok"}), False),
    ],
    ids=[
        "tools",
        "empty-tools",
        "null-tools",
        "tool-msg",
        "function-msg",
        "tool-calls",
        "empty-calls",
        "plain",
    ],
)
def test_has_tools(body: dict[str, Any], expected: bool) -> None:
    assert facts(body).has_tools is expected


# --- prompt size and prefixes -------------------------------------------------------------------


def test_prompt_estimate_grows_with_text() -> None:
    sizes = [facts(chat(user("lorem ipsum " * n))).prompt_tokens for n in (1, 10, 100, 1000)]

    assert sizes == sorted(sizes)
    assert len(set(sizes)) == 4
    assert sizes[-1] >= 12 * 1000 // 4


def test_each_message_adds_template_overhead() -> None:
    one = facts(chat(user("hi"))).prompt_tokens
    two = facts(chat(user("hi"), user("hi"))).prompt_tokens

    assert two > 2 * one - 1


def test_prefix_chain_is_equal_up_to_the_divergence_and_differs_after() -> None:
    shared = "s" * (3 * PREFIX_BLOCK_CHARS + PREFIX_BLOCK_CHARS // 2)
    a = prefix_chain(shared + "a" * (2 * PREFIX_BLOCK_CHARS))
    b = prefix_chain(shared + "b" * (2 * PREFIX_BLOCK_CHARS))

    assert len(a) == len(b) == 5
    assert a[:3] == b[:3]
    assert all(x != y for x, y in zip(a[3:], b[3:], strict=True))


def test_prefix_chain_of_identical_text_is_identical_and_short_text_has_none() -> None:
    text = "the same document " * 200

    assert prefix_chain(text) == prefix_chain(text)
    assert prefix_chain("x" * (PREFIX_BLOCK_CHARS - 1)) == ()


def test_prefix_chain_is_bounded() -> None:
    huge = prefix_chain("y" * (PREFIX_BLOCK_CHARS * 1000))

    assert 0 < len(huge) < 1000


def test_shared_system_prompt_gives_shared_fingerprint() -> None:
    document = "A long reference document. " * 400
    q1 = facts(chat({"role": "system", "content": document}, user("what is in section 1?")))
    q2 = facts(chat({"role": "system", "content": document}, user("summarise section 2")))
    other = facts(
        chat({"role": "system", "content": "Different. " + document}, user("what is in section 1?"))
    )

    fp1, fp2 = q1.prefix_fingerprint(512), q2.prefix_fingerprint(512)
    assert fp1 is not None
    assert fp1 == fp2
    assert other.prefix_fingerprint(512) not in (None, fp1)


def test_prefix_fingerprint_needs_min_tokens_of_prompt() -> None:
    short = facts(chat(user("word " * 100)))  # ≈ 125 tokens
    long = facts(chat(user("word " * 1000)))  # ≈ 1250 tokens

    assert short.prefix_fingerprint(512) is None
    assert long.prefix_fingerprint(512) is not None
    assert short.prefix_fingerprint(64) is not None


def test_prefix_fingerprint_covers_exactly_the_leading_min_tokens() -> None:
    lead = "z" * (512 * 4)
    a = facts({"model": "m", "prompt": lead + "tail one " * 500}, "completions")
    b = facts({"model": "m", "prompt": lead + "different ending " * 500}, "completions")

    assert a.prefix_fingerprint(512) == b.prefix_fingerprint(512) is not None
    beyond_a, beyond_b = a.prefix_fingerprint(1024), b.prefix_fingerprint(1024)
    assert beyond_a is not None
    assert beyond_b is not None
    assert beyond_a != beyond_b
