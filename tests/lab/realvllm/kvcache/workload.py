"""Documents for the KV-cache tests, a stream following a server's publisher, and the engines'
own word on their prefix cache."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import zmq.asyncio

from router.fleet.kvstream import Stream, start
from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.kvcache.pair import BLOCK, KEY, MODEL, KVServer
from tests.lab.realvllm.realrouter import scrape

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
# ≈570 tokens with the tiny model's tokenizer and chat template, whatever the document's number
# (below 1,000): 4 full blocks and a partial one.
WORDS = 80
FULL_BLOCKS = 4


def document(i: int) -> list[dict[str, str]]:
    """One distinct long document as a chat prompt; no two share a leading block."""
    text = f"Document {i:03d}: " + " ".join(f"w{i:03d}x{j}" for j in range(WORDS))
    return [{"role": "user", "content": text}]


async def token_ids(server: VllmServer, messages: list[dict[str, str]]) -> list[int]:
    """The prompt's token ids as the engine sees them (vLLM's /tokenize applies the chat template)."""
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await client.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": messages})
        resp.raise_for_status()
        ids: list[int] = resp.json()["tokens"]
        return ids


@dataclass(frozen=True)
class Counters:
    hits: float
    queries: float

    def __add__(self, other: Counters) -> Counters:
        return Counters(self.hits + other.hits, self.queries + other.queries)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.hits - other.hits, self.queries - other.queries)

    @property
    def rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


async def counters(server: VllmServer) -> Counters:
    samples = await scrape(server)
    return Counters(samples.total(HITS), samples.total(QUERIES))


async def counted(server: VllmServer, before: Counters, queried: int, timeout: float = 30.0) -> Counters:
    """The server's counters since `before`, once `queried` prompt tokens are counted in them (a
    server records a request a moment after its response has gone out)."""
    deadline = time.monotonic() + timeout
    while True:
        delta = await counters(server) - before
        if delta.queries >= queried or time.monotonic() >= deadline:
            return delta
        await asyncio.sleep(0.02)


def held(stream: Stream, ids: list[int]) -> int:
    """The prompt's leading tokens the stream's index says the engine holds."""
    return stream.index.cached_tokens(stream.index.keyer.chain_keys(ids, BLOCK))


async def until_held(stream: Stream, ids: list[int], timeout: float = 30.0) -> int:
    """Wait until the index holds every full block of the prompt (its engine just stored them)."""
    full = len(ids) // BLOCK * BLOCK
    deadline = time.monotonic() + timeout
    while (n := held(stream, ids)) < full and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return n


@asynccontextmanager
async def following(kv: KVServer) -> AsyncIterator[Stream]:
    """A stream following the server's publisher, once its SUB socket is connected."""
    ctx = zmq.asyncio.Context()
    stream = Stream()
    task = start(ctx, kv.events, kv.replay, stream)
    try:
        async with asyncio.timeout(30):
            while not stream.connected:
                await asyncio.sleep(0.02)
        yield stream
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ctx.destroy(linger=0)


async def ask(client: httpx.AsyncClient, kv: KVServer, doc: int) -> None:
    resp = await client.post(
        f"{kv.server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": MODEL, "messages": document(doc), "max_tokens": 1},
    )
    resp.raise_for_status()
