"""The router's prompt estimate is never below what the real vLLM counts, for any text.

Generated conversations (any script: CJK, emoji, combining marks, control characters; tool
definitions and tool calls) are counted by the router — with its default upper bound and with
the model's own tokenizer.json — and by the real server's `/tokenize`, which applies the chat
template exactly as generation does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.request.facts import parse_facts
from router.request.tokens import PromptCounter, make_counter
from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=300)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.from_regex(r"[a-z_]{1,12}", fullmatch=True)}),
    }
)
CALL = st.fixed_dictionaries(
    {
        "id": st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
                "arguments": TEXT.map(orjson.dumps).map(bytes.decode),
            }
        ),
    }
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT}),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), min_size=1, max_size=3
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.none(),
            "tool_calls": st.lists(CALL, min_size=1, max_size=2),
        }
    ),
)


@pytest.fixture(scope="module")
def tokenize(real_pools: RealPools) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=real_pools.interactive.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def counters(real_pools: RealPools) -> dict[str, PromptCounter]:
    return {"utf8-bytes": make_counter(None), "tokenizer": make_counter(str(real_pools.tokenizer))}


def vllm_count(client: httpx.Client, body: dict[str, Any]) -> int | None:
    """What the server counts for the prompt; None when it refuses the conversation."""
    resp = client.post("/tokenize", json={**body, "add_generation_prompt": True})
    if resp.status_code != 200:
        return None
    count: int = resp.json()["count"]
    return count


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGE, min_size=1, max_size=5), tools=st.lists(TOOL, max_size=3))
def test_the_estimate_is_an_upper_bound_of_vllms_count(
    tokenize: httpx.Client, counters: dict[str, PromptCounter], messages: list[Any], tools: list[Any]
) -> None:
    body: dict[str, Any] = {"model": MODEL_NAME, "messages": messages}
    if tools:
        body["tools"] = tools
    counted = vllm_count(tokenize, body)
    if counted is None:
        return
    for name, counter in counters.items():
        estimate = parse_facts("chat", orjson.dumps(body), counter).prompt_tokens
        assert estimate >= counted, f"{name}: {estimate} < vLLM's {counted} for {body!r}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3)))
def test_the_completions_estimate_is_an_upper_bound_too(
    tokenize: httpx.Client, counters: dict[str, PromptCounter], prompt: Any
) -> None:
    prompts = prompt if isinstance(prompt, list) else [prompt]
    counted = 0
    for text in prompts:
        resp = tokenize.post("/tokenize", json={"model": MODEL_NAME, "prompt": text})
        if resp.status_code != 200:
            return  # a prompt the server refuses is never generated from
        counted += resp.json()["count"]
    for name, counter in counters.items():
        body = orjson.dumps({"model": MODEL_NAME, "prompt": prompt})
        estimate = parse_facts("completions", body, counter).prompt_tokens
        assert estimate >= counted, f"{name}: {estimate} < vLLM's {counted} for {prompt!r}"
