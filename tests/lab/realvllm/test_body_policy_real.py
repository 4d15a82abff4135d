"""The body policy against the real vLLM: the output bound vLLM obeys is the one the router
judged, the router's priority orders vLLM's scheduler, and per-key cache salts keep tenants out of
each other's prefix cache — each read from what the server itself did (its usage report, its
counters, the order it finished requests in)."""

from __future__ import annotations

import asyncio
import random
import string
import uuid
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from router.keys.auth import hash_key
from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MODEL_NAME
from tests.lab.realvllm.realrouter import (
    RUNNING,
    WAITING,
    RealRouter,
    Samples,
    real_router,
    scrape,
    wait_for,
    wait_idle,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

EOS_OFF: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
MESSAGES: list[Any] = [{"role": "user", "content": "Count to ten."}]
HITS = "vllm:prefix_cache_hits_total"


def _capped(pools: RealPools, cap: int) -> dict[str, Any]:
    data = pools.profile()
    for lane in data["lanes"].values():
        lane["max_output_tokens"] = cap
    return data


async def test_vllm_obeys_the_bound_the_router_judged(real_pools: RealPools) -> None:
    async with real_router(_capped(real_pools, 12)) as front:
        await front.settled()
        api = front.openai()
        chat = api.chat.completions
        # Both output fields: vLLM honours max_completion_tokens, and so does the router.
        both = await chat.create(
            model=MODEL_NAME,
            messages=MESSAGES,
            max_tokens=100000,
            max_completion_tokens=5,
            **EOS_OFF,
        )
        assert both.usage is not None and both.usage.completion_tokens == 5
        # No bound stated: the lane's cap is written, and vLLM generates exactly that.
        unbounded = await chat.create(model=MODEL_NAME, messages=MESSAGES, **EOS_OFF)
        assert unbounded.usage is not None and unbounded.usage.completion_tokens == 12
        # n multiplies the output: 3 × 4 fits the cap of 12, 4 × 4 does not.
        sampled: dict[str, Any] = {"temperature": 1.0, "extra_body": {"ignore_eos": True}}  # n > 1
        three = await chat.create(model=MODEL_NAME, messages=MESSAGES, n=3, max_tokens=4, **sampled)
        assert three.usage is not None and three.usage.completion_tokens == 12
        with pytest.raises(openai.BadRequestError):
            await chat.create(model=MODEL_NAME, messages=MESSAGES, n=4, max_tokens=4, **sampled)
        # Completions: max_tokens is the only output field; vLLM's default of 16 when unset is
        # written by the router (capped by the lane).
        done = await api.completions.create(model=MODEL_NAME, prompt="one two", max_tokens=5, **EOS_OFF)
        assert done.usage is not None and done.usage.completion_tokens == 5
        default = await api.completions.create(model=MODEL_NAME, prompt="one two", **EOS_OFF)
        assert default.usage is not None and default.usage.completion_tokens == 12
        with pytest.raises(openai.BadRequestError) as refused:
            await api.completions.create(
                model=MODEL_NAME,
                prompt="one two",
                extra_body={"max_completion_tokens": 5, "ignore_eos": True},
            )
        assert "max_completion_tokens" in str(refused.value)


def _isolated(pools: RealPools) -> tuple[dict[str, Any], dict[str, str]]:
    data = pools.profile()
    keys = {"alpha": "alpha-" + uuid.uuid4().hex, "beta": "beta-" + uuid.uuid4().hex}
    data["prefix_cache_isolation"] = "per_key"
    data["classify"]["long_context_tokens"] = 100000  # every document stays on the interactive server
    data["keys"] = [
        {"name": "alpha", "sha256": hash_key(keys["alpha"])},
        {"name": "beta", "sha256": hash_key(keys["beta"])},
        {"name": "alpha-team", "sha256": hash_key("team-" + keys["alpha"]), "cache_group": "alpha-g"},
        {"name": "alpha-too", "sha256": hash_key("too-" + keys["alpha"]), "cache_group": "alpha-g"},
    ]
    keys["alpha-team"], keys["alpha-too"] = "team-" + keys["alpha"], "too-" + keys["alpha"]
    return data, keys


def _document() -> str:
    rng = random.Random(uuid.uuid4().int)
    letters = string.ascii_lowercase
    return " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(400))


async def _hits_after(pools: RealPools, front: RealRouter, key: str, prompt: str) -> float:
    """The interactive server's prefix-cache hits added by one request of `prompt` from `key`."""
    server = pools.interactive
    before = (await scrape(server)).total(HITS)
    api = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key=key, max_retries=0, timeout=60)
    reply = await api.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)
    assert reply.usage is not None and reply.usage.prompt_tokens >= 512
    return (await scrape(server)).total(HITS) - before


async def test_cache_salt_keeps_each_key_in_its_own_prefix_cache(real_pools: RealPools) -> None:
    data, keys = _isolated(real_pools)
    async with real_router(data) as front:
        await front.settled()
        prompt = _document()
        assert await _hits_after(real_pools, front, keys["alpha"], prompt) < 128
        # The same key again: its own blocks are found (at least four 128-token blocks).
        assert await _hits_after(real_pools, front, keys["alpha"], prompt) >= 512
        # Another key: nothing of alpha's is found, though the prompt is identical.
        assert await _hits_after(real_pools, front, keys["beta"], prompt) < 128
        # A group shares one cache: the second member finds the first's blocks.
        shared = _document()
        assert await _hits_after(real_pools, front, keys["alpha-team"], shared) < 128
        assert await _hits_after(real_pools, front, keys["alpha-too"], shared) >= 512


async def test_a_clients_cache_salt_or_priority_never_reaches_vllm(real_pools: RealPools) -> None:
    async with real_router(real_pools.profile()) as front:
        await front.settled()
        chat = front.openai().chat.completions
        for field, value in (("cache_salt", "guess"), ("priority", -100)):
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await chat.create(
                    model=MODEL_NAME, messages=MESSAGES, max_tokens=2, extra_body={field: value}
                )
            assert field in str(refused.value)


def _priority_profile(pools: RealPools) -> dict[str, Any]:
    """The chat lane (priority 0) and the batch lane (priority 9) on the interactive server,
    which schedules by priority."""
    data = pools.profile()
    for name in ("chat", "batch"):
        data["lanes"][name]["pool"] = "interactive"
    data["lanes"]["chat"]["priority"] = 0
    data["lanes"]["batch"]["priority"] = 9
    return data


SATURATE = 16  # the interactive server's max_num_seqs


@dataclass
class PriorityRound:
    conclusive: bool  # every saturating request was still running when one slot was freed
    order: list[str]
    seen: str = ""  # what the round saw of the server, for a round that proved nothing


async def _first_token(stream: Any, seen: asyncio.Event) -> None:
    async for chunk in stream:
        if any(c.delta.content for c in chunk.choices):
            seen.set()


async def _until(server: Any, metric: str, n: int) -> Samples:
    """The server's metrics once `metric` reaches `n` (or the last scrape, after 60 s)."""
    return await wait_for(server, lambda s: s.total(metric) >= n, timeout=60)


async def _priority_round(pools: RealPools, front: RealRouter) -> PriorityRound:
    """Fill every sequence slot with long batch-lane requests, queue a batch-lane request and
    then a chat-lane one, free one slot: vLLM must start the chat request first.

    The fillers are not streamed: a server that streams sixteen answers spends its API process
    on them, and on a busy host its metrics (what this round waits on) then answer so slowly
    that the fillers run to their end before the round frees a slot."""
    server = pools.interactive
    await wait_idle(server)
    batch_api, chat_api = front.openai("nightly"), front.openai()
    long: dict[str, Any] = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 1900, **EOS_OFF}
    fillers = [asyncio.create_task(batch_api.chat.completions.create(**long)) for _ in range(SATURATE)]
    queued_task: asyncio.Task[None] | None = None
    queued: Any = None
    try:
        full = await _until(server, RUNNING, SATURATE)
        queued = await batch_api.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=4, stream=True, **EOS_OFF
        )
        queued_first = asyncio.Event()
        queued_task = asyncio.create_task(_first_token(queued, queued_first))
        one = await _until(server, WAITING, 1)
        chat = asyncio.create_task(
            chat_api.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, **EOS_OFF)
        )
        two = await _until(server, WAITING, 2)
        ended = sum(f.done() for f in fillers)
        conclusive = full.total(RUNNING) >= SATURATE and one.total(WAITING) >= 1
        conclusive = conclusive and two.total(WAITING) >= 2 and not ended
        seen = (
            f"running {full.total(RUNNING)}, waiting {one.total(WAITING)} then {two.total(WAITING)},"
            f" {ended} fillers ended"
        )
        fillers[0].cancel()  # its client leaves, one slot frees: vLLM picks the next request to run
        done, _ = await asyncio.wait([chat, asyncio.create_task(queued_first.wait())], timeout=120,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        order = ["chat" if chat in done else "batch"]
        for task in fillers:
            task.cancel()
        await asyncio.wait_for(chat, 120)
        await asyncio.wait_for(queued_task, 120)
        return PriorityRound(conclusive, order, seen)
    finally:
        for task in fillers:
            task.cancel()
        await asyncio.gather(*fillers, return_exceptions=True)
        if queued_task is not None:
            queued_task.cancel()
        if queued is not None:
            await queued.close()


async def test_the_lanes_priority_orders_vllms_scheduler(real_pools: RealPools) -> None:
    """vLLM's priority scheduler takes the waiting request of highest priority (lowest number)
    when a slot frees, whatever arrived first: a chat request queued behind a batch one starts
    first only if vLLM received the lanes' priorities from the router."""
    async with real_router(_priority_profile(real_pools)) as front:
        await front.settled()
        rounds: list[PriorityRound] = []
        # A host stall can let a saturating request end before the slot is freed on purpose;
        # such a round proves nothing and is repeated.
        while len(rounds) < 3:
            rounds.append(await _priority_round(real_pools, front))
            if rounds[-1].conclusive:
                break
        assert rounds[-1].conclusive, rounds
        assert rounds[-1].order == ["chat"], rounds
