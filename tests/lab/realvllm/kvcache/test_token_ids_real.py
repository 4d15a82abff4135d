"""The token ids the router works out for a `precise_prefix` lane (the model's tokenizer and chat
template, router/request/promptids.py) are the ids the real engine computes: equal to vLLM's own
`/tokenize`, and every full block of them is what the engine then reports storing in its KV
events (the router's index of that engine holds them)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from router.request.chattemplate import counter_for
from router.request.facts import parse_facts
from router.request.tokenizer_source import find_tokenizer
from router.request.tokens import PromptCosts, PromptCounter
from tests.lab.realvllm.conftest import require_install
from tests.lab.realvllm.kvcache.pair import BLOCK, KEY, MODEL, KVPair
from tests.lab.realvllm.kvcache.workload import following, until_held

# Start-up of the pair is counted in the first test's time, on a host busy with other work.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

TEXT = "The harbour master records each vessel that enters the port, its flag and its cargo. "
CHATS = {
    "one user message": [{"role": "user", "content": TEXT * 8}],
    "a conversation": [
        {"role": "system", "content": "You answer from the harbour records. " * 4},
        {"role": "user", "content": TEXT * 4},
        {"role": "assistant", "content": "Three vessels entered on Monday."},
        {"role": "user", "content": "And on Tuesday? " + TEXT * 3},
    ],
}


def counter() -> PromptCounter:
    model = require_install().model(MODEL)
    return counter_for(find_tokenizer(MODEL, str(model), None, {}), PromptCosts())


def router_ids(route: str, body: dict[str, Any]) -> list[int] | None:
    if route == "chat":
        return parse_facts("chat", orjson.dumps(body), counter()).token_ids
    ids = counter().ids
    return None if ids is None else ids.of("completions", body)


async def engine_ids(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[int]:
    resp = await client.post(f"{url}/tokenize", json=body)
    resp.raise_for_status()
    ids: list[int] = resp.json()["tokens"]
    return ids


@pytest.mark.parametrize(
    ("route", "body"),
    [("chat", {"model": MODEL, "messages": m}) for m in CHATS.values()]
    + [("completions", {"model": MODEL, "prompt": TEXT * 8})],
    ids=[*CHATS, "completions prompt"],
)
async def test_the_routers_ids_are_the_engines(kv_pair: KVPair, route: str, body: dict[str, Any]) -> None:
    kv = kv_pair.servers[0]
    ids = router_ids(route, body)
    assert ids is not None
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    async with following(kv) as stream, httpx.AsyncClient(timeout=120) as client:
        assert ids == await engine_ids(client, kv.server.url, body)
        assert len(ids) >= 2 * BLOCK
        resp = await client.post(
            f"{kv.server.url}{path}",
            headers={"Authorization": f"Bearer {KEY}"},
            json={**body, "max_tokens": 1},
        )
        resp.raise_for_status()
        assert resp.json()["usage"]["prompt_tokens"] == len(ids)
        # What the engine stored, as its events say, is the router's ids block for block.
        assert await until_held(stream, ids) == len(ids) // BLOCK * BLOCK
