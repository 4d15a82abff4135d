"""A `precise_prefix` lane, through the router on loopback: the prompt's token ids, as the engine
will compute them, meet what each backend's KV events say its engine holds, so a request goes to
the backend holding its prompt — and follows the blocks when they move. Only the lanes of that
strategy have token ids worked out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.fleet.adapters import AdapterNeed
from router.fleet.kvevents import BlockStored
from router.fleet.kvstream import Stream
from router.lab.sim.protocol import parse_generation
from router.proxy.handler import engine_token_ids
from router.request.chattemplate import counter_for
from router.request.facts import parse_facts
from router.request.tokenizer_source import find_tokenizer
from router.request.tokens import PromptCosts
from tests.conftest import Stack, router_stack
from tests.request.test_tokenizer_source import TOKENIZER, model_dir
from tests.support.profiles import MODEL, auth, profile

BLOCK = 16
TEXT = "the harbour master records each vessel that enters the port " * 20  # 1,200 characters
INTERACTIVE = ("chat", "rag", "agent", "slow_stream")


def _precise(tokenizer: str) -> Callable[[list[str]], dict[str, Any]]:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = profile(urls, tokenizer=tokenizer)
        # The test sets each backend's stream itself: the pool follows no publisher of its own
        # (whose /kv_event_sources questions the fake backends would count as requests).
        data["pools"]["interactive"]["kv_events"] = {"follow": False}
        for cls in INTERACTIVE:
            data["lanes"][cls]["balance"] = {"strategy": "precise_prefix"}
        return data

    return shape


@asynccontextmanager
async def _stack(tokenizer: str) -> AsyncIterator[Stack]:
    async with router_stack(n_backends=2, shape=_precise(tokenizer)) as s:
        yield s


def _holding(token_ids: list[int]) -> Stream:
    """A connected stream whose engine stored the prompt's full blocks."""
    full = len(token_ids) // BLOCK * BLOCK
    stream = Stream(connected=True)
    hashes = tuple(range(1, full // BLOCK + 1))
    stream.index.apply(
        [
            BlockStored(
                block_hashes=hashes,
                parent_block_hash=None,
                token_ids=tuple(token_ids[:full]),
                block_size=BLOCK,
                plain=True,
            )
        ]
    )
    return stream


def _holding_nothing() -> Stream:
    stream = Stream(connected=True)
    stream.index.apply(
        [
            BlockStored(
                block_hashes=(99,),
                parent_block_hash=None,
                token_ids=tuple(range(7, 7 + BLOCK)),
                block_size=BLOCK,
                plain=True,
            )
        ]
    )
    return stream


def _received(stack: Stack) -> list[int]:
    return [len(b.seen) for b in stack.backends]


async def _placed_where_held(stack: Stack, path: str, body: dict[str, Any], token_ids: list[int]) -> None:
    pool = stack.state.runtime.pools["interactive"]
    names = [b.name for b in pool.backends]
    assert len(token_ids) >= 4 * BLOCK
    async with stack.client() as client:
        for holder in (0, 1, 0):
            # The blocks sit on one engine, then on the other: the request follows them.
            for i, name in enumerate(names):
                pool.kv.streams[name] = _holding(token_ids) if i == holder else _holding_nothing()
            before = _received(stack)
            response = await client.post(path, json=body, headers=auth("user"))
            assert response.status_code == 200, response.text
            assert response.headers["x-lane-router-lane"] in INTERACTIVE
            sent = [after - earlier for after, earlier in zip(_received(stack), before, strict=True)]
            backend = stack.backend_urls.index(names[holder])
            assert sent == [int(i == backend) for i in range(len(sent))]


async def test_a_chat_request_goes_where_its_templates_blocks_are(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "the harbour master"}, {"role": "user", "content": TEXT}]
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    ids = TOKENIZER.encode(rendered + "<|im_start|>assistant\n", add_special_tokens=False).ids
    async with _stack(str(model_dir(tmp_path))) as stack:
        body = {"model": MODEL, "messages": messages, "max_tokens": 8}
        await _placed_where_held(stack, "/v1/chat/completions", body, ids)


async def test_a_completions_request_goes_where_its_prompts_blocks_are(tmp_path: Path) -> None:
    ids = TOKENIZER.encode(TEXT, add_special_tokens=True).ids
    async with _stack(str(model_dir(tmp_path))) as stack:
        body = {"model": MODEL, "prompt": TEXT, "max_tokens": 8}
        await _placed_where_held(stack, "/v1/completions", body, ids)


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_a_simulator_models_request_goes_where_its_engines_ids_are(kind: str) -> None:
    if kind == "chat":
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": TEXT}]}
    else:
        path, body = "/v1/completions", {"model": MODEL, "prompt": TEXT}
    ids = parse_generation(
        body, kind, served_models=[MODEL], max_model_len=1 << 20, priority_enabled=False
    ).prompt_token_ids
    async with _stack("simulator") as stack:
        await _placed_where_held(stack, path, {**body, "max_tokens": 8}, ids)


async def test_only_precise_prefix_lanes_work_out_token_ids(tmp_path: Path) -> None:
    async with _stack(str(model_dir(tmp_path))) as stack:
        lanes = stack.state.runtime.lanes
        places = {name for name, lane in lanes.items() if lane.settings.token_ids}
        assert places == set(INTERACTIVE)
        assert not lanes["long_context"].settings.token_ids


def test_a_prompt_whose_blocks_the_engine_keys_with_more_than_its_tokens_has_no_ids(tmp_path: Path) -> None:
    counter = counter_for(find_tokenizer("m", str(model_dir(tmp_path)), None, {}), PromptCosts())
    chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": TEXT}]})
    facts = parse_facts("chat", chat, counter)
    assert facts.token_ids

    assert engine_token_ids(counter, facts, None, None) == facts.token_ids
    assert engine_token_ids(counter, facts, AdapterNeed("sql-lora", None, True), None) == ()
    assert engine_token_ids(counter, facts, None, "tenant-salt") == ()
    salted = orjson.dumps({"model": "m", "prompt": TEXT, "cache_salt": "mine"})
    assert engine_token_ids(counter, parse_facts("completions", salted, counter), None, None) == ()
    plain = orjson.dumps({"model": "m", "prompt": TEXT})
    assert engine_token_ids(counter, parse_facts("completions", plain, counter), None, None) == (
        TOKENIZER.encode(TEXT, add_special_tokens=True).ids
    )
