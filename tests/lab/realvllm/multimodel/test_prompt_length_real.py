"""Without `tokenizer:` in the profile, a ~1,500-token English RAG prompt is measured by its real
length — the server's own `/tokenize` count, chat template included — not by its UTF-8 bytes
(about 2,900 here, which would make it long_context and longer than the context); prompts of
dense scripts are still never undercounted; and a key's `tpm` is charged what vLLM reports."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.multimodel.front import chat, http, tokenize
from tests.lab.realvllm.multimodel.profile import (
    LONG_CONTEXT_TOKENS,
    MAX_MODEL_LEN,
    MODEL_A,
    MODEL_B,
    TPM,
    TwoModels,
)
from tests.lab.realvllm.realrouter import RealRouter

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

SENTENCES = [
    "The gateway keeps a separate queue for every lane, so a long report never delays a short question.",
    "Operators configure each pool with the model it serves and the servers that run it.",
    "When a server stops answering its health checks, the router takes it out of rotation within seconds.",
    "Keys carry their own limits on requests and tokens per minute, and the router refuses politely "
    "when they run out.",
    "A retrieval pipeline sends the same instructions and documents many times, with a different "
    "question at the end.",
    "Prefix caching lets the server reuse the work it did for the shared beginning of those prompts.",
    "The release notes describe how the team measured the cost of every change on the request path.",
    "Support engineers answer questions about billing, outages and the behaviour of streaming responses.",
]
DOCUMENTS = 5
OUT = 64


def rag_prompt() -> str:
    docs = []
    for d in range(DOCUMENTS):
        body = " ".join(SENTENCES[(d + i) % len(SENTENCES)] for i in range(5))
        docs.append(f"[{d + 1}] Document {d + 1} of the operations handbook. {body}")
    return (
        "Answer the question from the documents below.\n\n"
        + "\n\n".join(docs)
        + "\n\nQuestion: how does the gateway keep short questions fast?"
    )


def rag_body(model: str) -> dict[str, Any]:
    return chat(model, rag_prompt(), OUT, temperature=0, ignore_eos=True)


async def real_length(server: VllmServer, body: dict[str, Any]) -> int:
    counted = await tokenize(server, body)
    # What the test stands for: the real length is on one side of the class threshold and the
    # context, the byte count on the other.
    assert 1300 <= counted < LONG_CONTEXT_TOKENS < MAX_MODEL_LEN < len(rag_prompt().encode())
    return counted


@pytest.mark.parametrize("model", [MODEL_A, MODEL_B])
async def test_a_rag_prompt_is_classified_by_its_real_length(
    two_models: TwoModels, mm_router: RealRouter, model: str
) -> None:
    body = rag_body(model)
    counted = await real_length(two_models.b if model == MODEL_B else two_models.a, body)
    async with http(mm_router) as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert (
        int(resp.headers["x-lane-router-prompt-tokens"]) == counted == resp.json()["usage"]["prompt_tokens"]
    )
    assert resp.headers["x-lane-router-reason"] != "long_prompt"
    assert not resp.headers["x-lane-router-class"].endswith("long_context")


DENSE = ["路由器把每个请求送到合适的队列。" * 20, "🚦🛣️🚗💨" * 40, "ルーターは要求を振り分ける。" * 20]


@pytest.mark.parametrize("text", DENSE, ids=["cjk", "emoji", "kana"])
async def test_dense_scripts_are_never_undercounted(
    two_models: TwoModels, mm_router: RealRouter, text: str
) -> None:
    for model, server in ((MODEL_A, two_models.a), (MODEL_B, two_models.b)):
        body = chat(model, text, 1)
        counted = await tokenize(server, body)
        async with http(mm_router) as client:
            resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        assert (
            int(resp.headers["x-lane-router-prompt-tokens"])
            >= counted
            == resp.json()["usage"]["prompt_tokens"]
        )


async def ended(router: RealRouter, before: float) -> None:
    """Wait until the router has finished its request (and settled the key's tokens)."""
    deadline = time.monotonic() + 30
    while router.metric("lane_router_requests_total") <= before:
        assert time.monotonic() < deadline, "the router never finished the request"
        await asyncio.sleep(0.02)


async def test_a_keys_tpm_is_charged_what_vllm_reports(two_models: TwoModels, mm_router: RealRouter) -> None:
    body = rag_body(MODEL_A)
    counted = await real_length(two_models.a, body)
    began = time.monotonic()
    requests = mm_router.metric("lane_router_requests_total")
    async with http(mm_router, "metered") as client:
        first = await client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        # Reserved up front from the key's full bucket: the prompt's real length and the output bound.
        assert int(first.headers["x-ratelimit-remaining-tokens"]) == TPM - counted - OUT
        usage = first.json()["usage"]
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        await ended(mm_router, requests)
        second = await client.post("/v1/chat/completions", json=chat(MODEL_A, "Thanks.", 1))
    took = time.monotonic() - began
    assert second.status_code == 200, second.text
    # The key's bucket started full; the second request reserves its prompt and its one token.
    reserved = int(second.headers["x-lane-router-prompt-tokens"]) + 1
    remaining = int(second.headers["x-ratelimit-remaining-tokens"])
    # The bucket refills continuously (TPM a minute) meanwhile: at most this much.
    refill = math.ceil(took * TPM / 60)
    assert TPM - used - reserved <= remaining <= min(TPM, TPM - used + refill) - reserved, (
        f"charged {TPM - reserved - remaining} (±{refill} refill), vLLM reported {used}"
    )
