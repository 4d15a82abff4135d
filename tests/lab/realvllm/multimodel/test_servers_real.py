"""The two-model servers themselves, spoken to directly: what the router in front of them builds
on. Server A serves `tiny` and its adapter, loads another at run time, counts prompts and speaks
the Anthropic Messages API; server B serves an unrelated model that counts the same text
differently."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.multimodel.profile import ADAPTER, MODEL_A, MODEL_B, TwoModels

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

MESSAGES = [{"role": "user", "content": "Summarise the release notes of the router in one line."}]
# Loaded here under a name of its own, from the start-up adapter's directory: the adapter the
# router loads on demand (LAZY_ADAPTER) stays unloaded for the router's tests.
DIRECT = "direct-lora"


def client(server: VllmServer) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {server.api_key}"}, timeout=120
    )


def served(server: VllmServer) -> dict[str, dict[str, Any]]:
    with client(server) as http:
        resp = http.get("/v1/models")
    resp.raise_for_status()
    return {m["id"]: m for m in resp.json()["data"]}


def greedy(server: VllmServer, model: str, tokens: int = 12) -> dict[str, Any]:
    body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    with client(server) as http:
        resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_each_server_lists_its_own_models(two_models: TwoModels) -> None:
    on_a, on_b = served(two_models.a), served(two_models.b)
    assert {MODEL_A, ADAPTER} <= set(on_a)
    assert on_a[ADAPTER]["parent"] == MODEL_A
    assert set(on_b) == {MODEL_B}
    assert on_a[MODEL_A]["max_model_len"] == on_b[MODEL_B]["max_model_len"] == 2048


def test_each_model_and_the_adapter_answer(two_models: TwoModels) -> None:
    base, adapted = greedy(two_models.a, MODEL_A), greedy(two_models.a, ADAPTER)
    other = greedy(two_models.b, MODEL_B)
    assert (base["model"], adapted["model"], other["model"]) == (MODEL_A, ADAPTER, MODEL_B)
    # The adapter's weights take part: greedy decoding of the same prompt goes elsewhere.
    assert adapted["choices"][0]["message"]["content"] != base["choices"][0]["message"]["content"]
    assert base["usage"]["completion_tokens"] == adapted["usage"]["completion_tokens"] == 12


def test_a_model_the_server_does_not_hold_is_404(two_models: TwoModels) -> None:
    body = {"model": ADAPTER, "messages": MESSAGES, "max_tokens": 2}
    with client(two_models.b) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 404


def tokenize(server: VllmServer, model: str) -> int:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        resp = http.post(
            "/tokenize", json={"model": model, "messages": MESSAGES, "add_generation_prompt": True}
        )
    resp.raise_for_status()
    count: int = resp.json()["count"]
    return count


def test_tokenize_counts_what_generation_counts_each_with_its_own_tokenizer(two_models: TwoModels) -> None:
    count_a, count_b = tokenize(two_models.a, MODEL_A), tokenize(two_models.b, MODEL_B)
    assert count_a == greedy(two_models.a, MODEL_A, 1)["usage"]["prompt_tokens"]
    assert count_b == greedy(two_models.b, MODEL_B, 1)["usage"]["prompt_tokens"]
    assert count_a != count_b


def test_the_messages_api_answers(two_models: TwoModels) -> None:
    # vLLM checks its --api-key only as a bearer token, also on these routes: `x-api-key` alone is
    # 401 there, so the router sends the pool's key as it does for every route.
    alone = {"x-api-key": two_models.a.api_key, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=two_models.a.url, headers=alone, timeout=120) as http:
        body = {"model": MODEL_A, "max_tokens": 5, "messages": MESSAGES}
        assert http.post("/v1/messages", json=body).status_code == 401
    headers = {"authorization": f"Bearer {two_models.a.api_key}", "anthropic-version": "2023-06-01"}
    body = {"model": MODEL_A, "max_tokens": 5, "messages": MESSAGES}
    with httpx.Client(base_url=two_models.a.url, headers=headers, timeout=120) as http:
        resp = http.post("/v1/messages", json=body)
        counted = http.post("/v1/messages/count_tokens", json={"model": MODEL_A, "messages": MESSAGES})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["type"] == "message" and answer["content"][0]["type"] == "text"
    assert answer["usage"]["output_tokens"] <= 5
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == answer["usage"]["input_tokens"]


def test_an_adapter_loads_at_run_time(two_models: TwoModels) -> None:
    path = two_models.install.model(ADAPTER)
    with client(two_models.a) as http:
        resp = http.post("/v1/load_lora_adapter", json={"lora_name": DIRECT, "lora_path": str(path)})
    assert resp.status_code == 200, resp.text
    assert served(two_models.a)[DIRECT]["parent"] == MODEL_A
    assert greedy(two_models.a, DIRECT)["model"] == DIRECT
