"""A lane's request shape (max_prompt_tokens, max_output_tokens) through a real router."""

from __future__ import annotations

from typing import Any

from tests.conftest import router_stack
from tests.support.profiles import MODEL, auth, profile


def shape(urls: list[str]) -> dict[str, Any]:
    data = profile(urls)
    data["classify"]["long_context_tokens"] = 100_000
    data["lanes"]["chat"].update(max_prompt_tokens=100, max_output_tokens=50)
    return data


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


async def test_requests_beyond_the_lanes_shape_are_refused_before_any_backend() -> None:
    async with router_stack(n_backends=1, shape=shape) as stack, stack.client() as client:
        long = await client.post("/v1/chat/completions", json=chat("word " * 200), headers=auth("user"))
        greedy = await client.post(
            "/v1/chat/completions", json=chat("hi", max_tokens=51), headers=auth("user")
        )
        assert stack.forwarded() == 0
        fits = await client.post("/v1/chat/completions", json=chat("hi", max_tokens=50), headers=auth("user"))
        unbounded = await client.post("/v1/chat/completions", json=chat("hi"), headers=auth("user"))

    assert (long.status_code, long.json()["error"]["code"]) == (400, "context_length_exceeded")
    assert long.json()["error"]["type"] == "invalid_request_error"
    assert (greedy.status_code, greedy.json()["error"]["code"]) == (400, "max_tokens_exceeded")
    assert fits.status_code == 200 and unbounded.status_code == 200
    assert stack.forwarded() == 2
