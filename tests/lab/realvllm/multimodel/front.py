"""Clients of the router in front of the two-model servers, and the servers' own answers."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.multimodel.profile import KEYS
from tests.lab.realvllm.realrouter import RealRouter


def http(router: RealRouter, key: str = "all") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=router.url, headers={"authorization": f"Bearer {KEYS[key]}"}, timeout=120
    )


def claude(router: RealRouter, key: str = "all") -> anthropic.AsyncAnthropic:
    """The Anthropic SDK pointed at the router: it sends the key as `x-api-key`."""
    return anthropic.AsyncAnthropic(base_url=router.url, api_key=KEYS[key], max_retries=0, timeout=120)


def chat(
    model: str, text: str = "Say something about routers.", tokens: int = 4, **extra: Any
) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": tokens, **extra}


async def served(server: VllmServer) -> dict[str, dict[str, Any]]:
    """What the server itself lists in /v1/models, by id."""
    headers = {"authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as client:
        resp = await client.get("/v1/models")
    resp.raise_for_status()
    return {m["id"]: m for m in resp.json()["data"]}


async def tokenize(server: VllmServer, body: dict[str, Any]) -> int:
    """The server's own count of a chat request's prompt, its chat template applied."""
    payload = {"model": body["model"], "messages": body["messages"], "add_generation_prompt": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        resp = await client.post("/tokenize", json=payload)
    resp.raise_for_status()
    count: int = resp.json()["count"]
    return count
