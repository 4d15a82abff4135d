"""Quick, bounded numbers from one OpenAI-compatible server: streaming tokens/s and TTFT.

    python -m router.lab.realvllm.probe --url http://127.0.0.1:8101 --key KEY

Prompts are given as token ids (seeded, drawn below id 2000 so they fit any vocabulary), which
makes their length exact without a tokenizer and keeps repeated runs free of prefix-cache hits.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import orjson

FIRST_ID, LAST_ID = 3, 2000


@dataclass(frozen=True)
class StreamResult:
    ttft_s: float
    total_s: float
    completion_tokens: int


@dataclass(frozen=True)
class Row:
    name: str
    value: float
    unit: str


def token_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(FIRST_ID, LAST_ID) for _ in range(length)]


async def stream_once(
    client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int
) -> StreamResult:
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if first is None and event.get("choices") and event["choices"][0].get("text"):
                first = time.perf_counter()
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    done = time.perf_counter()
    return StreamResult((first or done) - started, done - started, tokens)


async def throughput(
    client: httpx.AsyncClient, model: str, rng: random.Random, concurrency: int, max_tokens: int
) -> list[Row]:
    started = time.perf_counter()
    results = await asyncio.gather(
        *(stream_once(client, model, token_prompt(rng, 32), max_tokens) for _ in range(concurrency))
    )
    wall = time.perf_counter() - started
    tokens = sum(r.completion_tokens for r in results)
    return [
        Row(f"stream c={concurrency}: output tokens/s (aggregate)", tokens / wall, "tok/s"),
        Row(f"stream c={concurrency}: TTFT median", statistics.median(r.ttft_s for r in results) * 1e3, "ms"),
    ]  # fmt: skip


async def long_prompt_ttft(
    client: httpx.AsyncClient, model: str, rng: random.Random, prompt_tokens: int, repeats: int
) -> list[Row]:
    ttfts = [
        (await stream_once(client, model, token_prompt(rng, prompt_tokens), 1)).ttft_s for _ in range(repeats)
    ]
    return [
        Row(f"TTFT {prompt_tokens}-token prompt median (n={repeats})", statistics.median(ttfts) * 1e3, "ms"),
        Row(f"TTFT {prompt_tokens}-token prompt max", max(ttfts) * 1e3, "ms"),
    ]  # fmt: skip


async def served_model(client: httpx.AsyncClient) -> str:
    resp = await client.get("/v1/models")
    resp.raise_for_status()
    model: str = resp.json()["data"][0]["id"]
    return model


async def probe(args: argparse.Namespace) -> list[Row]:
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.key}"}
    timeout = httpx.Timeout(args.timeout)
    limits = httpx.Limits(max_connections=max(args.concurrency) + 1)
    async with httpx.AsyncClient(
        base_url=args.url, headers=headers, timeout=timeout, limits=limits
    ) as client:
        model = args.model or await served_model(client)
        # One short request first so lazy start-up work is not billed to the first measurement.
        await stream_once(client, model, token_prompt(rng, 8), 4)
        rows: list[Row] = []
        for concurrency in args.concurrency:
            rows += await throughput(client, model, rng, concurrency, args.max_tokens)
        rows += await long_prompt_ttft(client, model, rng, args.prompt_tokens, args.repeats)
        return rows


def render(rows: Sequence[Row]) -> str:
    width = max(len(r.name) for r in rows)
    return "\n".join(f"{r.name:<{width}}  {r.value:>10.1f} {r.unit}" for r in rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m router.lab.realvllm.probe", description=__doc__)
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8101")
    parser.add_argument("--key", required=True, help="API key sent as a Bearer token")
    parser.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per stream")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    parser.add_argument("--deadline", type=float, default=300.0, help="whole-probe limit, seconds")
    args = parser.parse_args(argv)
    if not all(1 <= c <= 64 for c in args.concurrency):
        parser.error("--concurrency values must be within 1..64")
    if not 1 <= args.max_tokens <= 1024:
        parser.error("--max-tokens must be within 1..1024")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rows = asyncio.run(asyncio.wait_for(probe(args), args.deadline))
    except (httpx.HTTPError, RuntimeError, TimeoutError) as exc:
        print(f"probe failed: {exc!r}", file=sys.stderr)
        return 1
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
