"""A model without a tokenizer: where the byte bound and its lower estimate straddle a decision,
the router asks a backend's /tokenize and decides on its count (real router, recording fake
backends on loopback; the fake server's tokenizer is tests/support/fakeapi.py `text_tokens`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.keys.auth import hash_key
from router.request.tokens import lower_estimate
from tests.conftest import Stack, router_stack
from tests.request.test_tokenizer_source import model_dir
from tests.support.anthropicapi import MESSAGES_KEY, input_tokens, messages_profile
from tests.support.fakeapi import chat_tokens
from tests.support.profiles import (
    CHAT_MODEL,
    EMBED_MODEL,
    MODEL,
    UPSTREAM_KEY,
    auth,
    multi_model_profile,
    profile,
)

LIMITED = "limited-key-0123456789"
PASSAGE = (
    "The harbour master records each vessel that enters the port, its cargo and the berth it is "
    "given, and the clerks copy the ledger into the archive at the end of every week. "
)


def no_tokenizer(urls: list[str]) -> dict[str, Any]:
    data = profile(urls)
    del data["tokenizer"]
    data["classify"]["long_context_tokens"] = 6000
    data["pools"]["interactive"]["vllm"] = {"max_model_len": 32768, "max_num_batched_tokens": 32768}
    data["keys"].append({"name": "limited", "sha256": hash_key(LIMITED), "tpm": 3000})
    return data


def rag_messages(tokens: int) -> list[dict[str, str]]:
    """A retrieval prompt of `tokens` tokens by the fake server's count: passages and a question."""
    question = {"role": "user", "content": "Which berth did the grain ship get?"}
    passages = ""
    while chat_tokens([{"role": "system", "content": passages + PASSAGE}, question]) <= tokens:
        passages += PASSAGE
    words = tokens - chat_tokens([{"role": "system", "content": passages}, question])
    passages += " ".join(["ledger"] * words)
    messages = [{"role": "system", "content": passages}, question]
    assert chat_tokens(messages) == tokens
    return messages


def tokenize_calls(stack: Stack) -> list[dict[str, Any]]:
    return [orjson.loads(s.body) for s in stack.seen() if s.path == "/tokenize"]


def counted(stack: Stack, how: str) -> str:
    metric = f'lane_router_prompt_counts_total{{how="{how}",model="{MODEL}"}}'
    lines = [
        line for line in stack.state.metrics.exposition().decode().splitlines() if line.startswith(metric)
    ]
    return lines[0].split()[-1] if lines else "0"


async def test_an_english_rag_prompt_is_classified_by_the_backends_count() -> None:
    messages = rag_messages(1500)
    body = {"model": MODEL, "messages": messages, "max_tokens": 16}
    assert len(orjson.dumps(messages)) > 6000  # its byte bound alone makes it long_context
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack, stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=body, headers=auth("user"))

        assert resp.status_code == 200
        assert resp.headers["x-lane-router-class"] == "chat"
        assert resp.headers["x-lane-router-prompt-tokens"] == "1500"
        (asked,) = tokenize_calls(stack)
        assert asked == {"model": MODEL, "messages": messages}
        (seen,) = [s for s in stack.seen() if s.path == "/tokenize"]
        assert seen.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert [s.path for s in stack.seen()] == ["/tokenize", "/v1/chat/completions"]
        assert counted(stack, "backend") == "1.0"


@pytest.mark.parametrize(
    "text", ["漢" * 7000, "😀" * 2000, "e\u0301" * 2000], ids=["cjk", "emoji", "combining"]
)
async def test_dense_scripts_are_counted_as_the_backend_counts_them(text: str) -> None:
    messages = [{"role": "user", "content": text}]
    exact = chat_tokens(messages)
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack, stack.client() as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 16},
            headers=auth("user"),
        )

        assert resp.status_code == 200
        assert int(resp.headers["x-lane-router-prompt-tokens"]) == exact
        assert resp.headers["x-lane-router-class"] == ("long_context" if exact >= 6000 else "chat")
        assert len(tokenize_calls(stack)) == 1


async def test_a_backend_that_cannot_count_leaves_the_byte_bound_deciding(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = rag_messages(1500)
    body = {"model": MODEL, "messages": messages, "max_tokens": 16}
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack, stack.client() as client:
        stack.backends[0].api.tokenize_status = 500
        with caplog.at_level(logging.WARNING, logger="lane_router.proxy"):
            answers = [
                await client.post("/v1/chat/completions", json=body, headers=auth("user")) for _ in range(2)
            ]

        for resp in answers:
            assert resp.status_code == 200
            assert resp.headers["x-lane-router-class"] == "long_context"
            assert int(resp.headers["x-lane-router-prompt-tokens"]) >= len(orjson.dumps(messages)) - 100
        assert len(tokenize_calls(stack)) == 2
        assert counted(stack, "byte_bound") == "2.0"
        warned = [r for r in caplog.records if "/tokenize" in r.getMessage()]
        assert len(warned) == 1


async def test_a_prompt_no_threshold_straddles_is_not_asked_about() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack, stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=body, headers=auth("user"))

        assert resp.status_code == 200
        assert tokenize_calls(stack) == []


@pytest.mark.parametrize(("path", "field"), [("/v1/completions", "prompt"), ("/v1/embeddings", "input")])
async def test_a_completions_prompt_or_embeddings_input_is_asked_about_as_a_prompt(
    path: str, field: str
) -> None:
    prompt = "x" * 3000  # the fake server counts its bytes: 3000, over the pool's long-prompt threshold
    body = {"model": MODEL, field: prompt, **({"max_tokens": 4} if field == "prompt" else {})}
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack, stack.client() as client:
        resp = await client.post(path, json=body, headers={**auth("user")})

        assert resp.status_code == 200
        assert tokenize_calls(stack) == [{"model": MODEL, "prompt": prompt}]
        assert resp.headers["x-lane-router-prompt-tokens"] == "3000"


async def test_a_keys_tpm_judges_the_backends_count() -> None:
    messages = rag_messages(1500)
    body = {"model": MODEL, "messages": messages, "max_tokens": 100}
    headers = {"authorization": f"Bearer {LIMITED}"}
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack, stack.client() as client:
        began = time.monotonic()
        first = await client.post("/v1/chat/completions", json=body, headers=headers)
        second = await client.post("/v1/chat/completions", json=body, headers=headers)
        slack = 3000 / 60 * (time.monotonic() - began) + 1

        # Its byte bound alone is more than the key's 3000 tokens a minute.
        assert first.status_code == 200
        assert first.headers["x-lane-router-prompt-tokens"] == "1500"
        # Reserved: the backend's count and the output bound.
        assert abs(int(first.headers["x-ratelimit-remaining-tokens"]) - (3000 - 1600)) <= slack
        # Settled on the usage the backend reported (17 tokens): room for the second reservation.
        assert second.status_code == 200
        remaining = int(second.headers["x-ratelimit-remaining-tokens"])
        assert abs(remaining - (3000 - 17 - 1600)) <= slack


async def test_each_model_is_counted_its_own_way(tmp_path: Path) -> None:
    """The chat model has no tokenizer: its own pools' backends count. The embedding model's
    tokenizer is in the profile: nothing is asked about it."""

    def shape(urls: list[str]) -> dict[str, Any]:
        data = multi_model_profile(*urls)
        del data["tokenizer"]
        data["classify"]["long_context_tokens"] = 6000
        data["models"] = {EMBED_MODEL: {"tokenizer": str(model_dir(tmp_path / "bge"))}}
        for key in data["keys"]:
            if key["name"] == "user":
                key["routes"] = ["chat", "embeddings"]
        return data

    messages = rag_messages(1500)
    async with router_stack(n_backends=3, shape=shape) as stack, stack.client() as client:
        chat = await client.post(
            "/v1/chat/completions",
            json={"model": CHAT_MODEL, "messages": messages, "max_tokens": 16},
            headers=auth("user"),
        )
        embedded = await client.post(
            "/v1/embeddings", json={"model": EMBED_MODEL, "input": PASSAGE * 60}, headers=auth("user")
        )

        assert chat.status_code == 200 and embedded.status_code == 200, (chat.text, embedded.text)
        assert (chat.headers["x-lane-router-class"], chat.headers["x-lane-router-prompt-tokens"]) == (
            "chat",
            "1500",
        )
        asked = [i for i, b in enumerate(stack.backends) for s in b.seen if s.path == "/tokenize"]
        assert len(asked) == 1 and asked[0] in (0, 1)  # the chat model's pools: fast, large
        assert [s.path for s in stack.backends[2].seen] == ["/v1/embeddings"]


@pytest.mark.parametrize(
    "extra",
    [
        {"documents": [{"title": "t", "text": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
    ],
    ids=["documents", "media"],
)
async def test_what_tokenize_cannot_count_keeps_the_byte_bound(extra: dict[str, Any]) -> None:
    messages = rag_messages(1500)
    if "messages" in extra:
        extra = {"messages": messages + extra["messages"]}
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, **extra}
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack, stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=body, headers=auth("user"))

        assert resp.status_code == 200, resp.text
        assert resp.headers["x-lane-router-class"] == "long_context"
        assert tokenize_calls(stack) == []


def anthropic_without_tokenizer(urls: list[str]) -> dict[str, Any]:
    data = messages_profile(urls)
    del data["tokenizer"]
    data["classify"]["long_context_tokens"] = 6000
    data["pools"]["interactive"]["vllm"] = {"max_model_len": 32768, "max_num_batched_tokens": 32768}
    return data


async def test_an_anthropic_message_is_classified_by_the_backends_count_of_it() -> None:
    """No tokenizer: a long English system prompt's byte bound alone makes it long_context; the
    backend's own count (vLLM's /v1/messages/count_tokens, which converts and renders the body as
    its Messages API does) decides instead, and the request is chat."""
    system = PASSAGE * 60
    body = {
        "model": MODEL,
        "system": system,
        "messages": [{"role": "user", "content": "Which berth did the grain ship get?"}],
        "max_tokens": 16,
    }
    async with (
        router_stack(n_backends=1, shape=anthropic_without_tokenizer) as stack,
        stack.client() as client,
    ):
        resp = await client.post("/v1/messages", json=body, headers={"x-api-key": MESSAGES_KEY})

        assert resp.status_code == 200, resp.text
        counts = [s for s in stack.seen() if s.path == "/v1/messages/count_tokens"]
        (asked,) = [orjson.loads(s.body) for s in counts]
        assert asked == {"model": MODEL, "system": system, "messages": body["messages"]}
        assert counts[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        expected = input_tokens(asked)
        assert expected < 6000 < len(system)
        assert resp.headers["x-lane-router-prompt-tokens"] == str(expected)
        assert resp.headers["x-lane-router-class"] == "chat"
        assert [s.path for s in stack.seen()] == ["/v1/messages/count_tokens", "/v1/messages"]


async def test_an_anthropic_message_with_an_image_keeps_its_bound() -> None:
    """Images are counted by the profile's image cost; the backend is not asked about them."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}
    body = {
        "model": MODEL,
        "system": PASSAGE * 60,
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}],
        "max_tokens": 16,
    }
    async with (
        router_stack(n_backends=1, shape=anthropic_without_tokenizer) as stack,
        stack.client() as client,
    ):
        resp = await client.post("/v1/messages", json=body, headers={"x-api-key": MESSAGES_KEY})

        assert resp.status_code == 200, resp.text
        assert resp.headers["x-lane-router-class"] == "long_context"
        assert [s.path for s in stack.seen()] == ["/v1/messages"]


async def _counted_as(stack: Stack, told: int, body: dict[str, Any]) -> tuple[int, int]:
    """What the router counts a prompt as when its backend's /tokenize says `told`, and the byte
    bound it counts without asking (the backend cannot count)."""
    api = stack.backends[0].api
    headers = auth("user")
    async with stack.client() as client:
        api.tokenize_status = 500
        bound = await client.post("/v1/chat/completions", json=body, headers=headers)
        api.tokenize_status, api.tokenize_count = 200, told
        told_resp = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert bound.status_code == 200, bound.text
    assert told_resp.status_code == 200, told_resp.text
    return int(told_resp.headers["x-lane-router-prompt-tokens"]), int(
        bound.headers["x-lane-router-prompt-tokens"]
    )


async def test_a_backend_counting_too_few_is_not_believed_below_the_lower_estimate() -> None:
    body = {"model": MODEL, "messages": rag_messages(1500), "max_tokens": 16}
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack:
        for told in (0, 1):
            counted_as, bound = await _counted_as(stack, told, body)
            assert counted_as == lower_estimate(bound)


async def test_a_backend_counting_too_many_is_not_believed_above_the_byte_bound() -> None:
    body = {"model": MODEL, "messages": rag_messages(1500), "max_tokens": 16}
    async with router_stack(n_backends=1, shape=no_tokenizer) as stack:
        counted_as, bound = await _counted_as(stack, 10**9, body)
        assert counted_as == bound
