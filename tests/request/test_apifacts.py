"""Facts of the Responses, rerank, score, tokenize and detokenize bodies: prompt bounds, output
bounds and tool use."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.errors import BadRequest
from router.request.facts import parse_facts
from router.request.rewrite import OutputCaps, output_bound, upstream_body
from router.request.tokens import make_counter

COUNTER = make_counter("utf8-bytes")


def _facts(endpoint: Any, body: dict[str, Any]) -> Any:
    return parse_facts(endpoint, orjson.dumps({"model": "m", **body}), COUNTER)


def test_a_responses_prompt_bounds_every_text_it_carries() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": "weather"}'}
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "x" * 300},
                {"type": "input_image", "image_url": "data:…"},
            ],
        },
        call,
        {"type": "function_call_output", "call_id": "c1", "output": "sunny" * 20},
    ]
    facts = _facts("responses", {"instructions": "be brief" * 10, "input": items, "max_output_tokens": 9})
    texts = 300 + 80 + len(orjson.dumps(call)) + 100
    assert facts.prompt_tokens >= texts + COUNTER.costs.image
    assert facts.has_tools and facts.max_tokens == 9 and facts.sequences == 1


def test_a_responses_bound_is_written_where_vllm_reads_it() -> None:
    facts = _facts("responses", {"input": "hi"})
    bound = output_bound(facts, OutputCaps(lane=100, key=None, context=2048))
    assert bound == 100
    assert orjson.loads(upstream_body(facts, bound, None, None))["max_output_tokens"] == 100


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("rerank", {"query": "q" * 10, "documents": ["d" * 20, "e" * 30]}),
        ("score", {"queries": ["q" * 10], "documents": "d" * 50}),
        ("tokenize", {"prompt": "p" * 60}),
        ("tokenize", {"messages": [{"role": "user", "content": "p" * 60}]}),
        ("detokenize", {"tokens": list(range(60))}),
    ],
)
def test_routes_without_output_have_no_bound_and_a_prompt_bound(endpoint: Any, body: dict[str, Any]) -> None:
    facts = _facts(endpoint, body)
    assert facts.prompt_tokens >= 60
    assert output_bound(facts, OutputCaps(lane=10, key=5, context=2048)) is None


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("responses", {"input": {"role": "user"}}),
        ("responses", {"input": ["not an item"]}),
        ("responses", {"input": "x", "background": True}),
        ("responses", {"input": "x", "max_output_tokens": 0}),
        ("rerank", {"query": "q"}),
        ("detokenize", {"tokens": ["a"]}),
    ],
)
def test_malformed_bodies_are_refused(endpoint: Any, body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        _facts(endpoint, body)


def test_a_rerank_counts_the_query_in_every_pair() -> None:
    query, docs = "q" * 3000, [f"document {i}" for i in range(200)]
    facts = _facts("rerank", {"query": query, "documents": docs})
    pairs = sum(3000 + len(d) + COUNTER.request() for d in docs)
    assert facts.prompt_tokens == pairs


@pytest.mark.parametrize(
    ("body", "pairs"),
    [
        ({"queries": "q" * 100, "documents": ["a" * 10] * 50}, 50 * (100 + 10)),
        ({"text_1": ["q" * 100], "text_2": ["a" * 10] * 50}, 50 * (100 + 10)),
        ({"data_1": ["q" * 100] * 3, "data_2": ["a" * 10] * 3}, 3 * (100 + 10)),
        ({"queries": ["q" * 100] * 3, "items": ["a" * 10] * 3}, 3 * (100 + 10)),
    ],
    ids=["1:N", "1:N-list", "N:N", "items"],
)
def test_a_score_counts_its_pairs_as_vllm_makes_them(body: dict[str, Any], pairs: int) -> None:
    n = len(body[next(k for k in body if k not in ("queries", "text_1", "data_1"))])
    assert _facts("score", body).prompt_tokens == pairs + n * COUNTER.request()


@pytest.mark.parametrize(
    "body",
    [
        {"queries": ["a", "b"], "documents": ["c", "d", "e"]},
        {"queries": "a", "documents": "b", "items": "c"},
        {"text_1": "a", "data_2": "b"},
        {"queries": [], "documents": ["a"]},
    ],
)
def test_score_bodies_vllm_could_pair_otherwise_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as info:
        _facts("score", body)
    assert info.value.code == "invalid_input"


def test_a_pooling_template_renders_its_instruction_and_kwargs_in_every_pair() -> None:
    plain = _facts("rerank", {"query": "q", "documents": ["d"] * 10})
    kwargs = {"instruction": "i" * 500, "chat_template_kwargs": {"note": "n" * 1000}}
    assert _facts("rerank", {"query": "q", "documents": ["d"] * 10, **kwargs}).prompt_tokens >= (
        plain.prompt_tokens + 10 * 1500
    )


@pytest.mark.parametrize("endpoint", ["responses", "tokenize"])
def test_chat_template_kwargs_count_on_every_templated_route(endpoint: Any) -> None:
    body = {"input": "hi"} if endpoint == "responses" else {"messages": [{"role": "user", "content": "hi"}]}
    kwargs = {"documents": [{"text": "d" * 100_000}]}
    assert _facts(endpoint, {**body, "chat_template_kwargs": kwargs}).prompt_tokens >= 100_000


def test_a_multimodal_score_item_counts_its_media_in_every_pair() -> None:
    image = {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
    facts = _facts("rerank", {"query": image, "documents": ["a", "b", "c"]})
    assert facts.prompt_tokens >= 3 * COUNTER.costs.image
