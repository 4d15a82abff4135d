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

from router.config.models import KeyConfig
from router.fleet.adapters import AdapterNeed
from router.fleet.kvevents import BlockStored
from router.fleet.kvstream import Stream
from router.keys.auth import cache_salt, hash_key
from router.lab.sim.protocol import parse_generation
from router.proxy.handler import engine_salt, engine_token_ids
from router.request.chattemplate import counter_for
from router.request.facts import parse_facts
from router.request.tokenizer_source import find_tokenizer
from router.request.tokens import PromptCosts
from tests.conftest import Stack, router_stack
from tests.request.test_tokenizer_source import TOKENIZER, model_dir
from tests.support.profiles import KEYS, MODEL, auth, profile

BLOCK = 16
TEXT = "the harbour master records each vessel that enters the port " * 20  # 1,200 characters
INTERACTIVE = ("chat", "rag", "agent", "slow_stream")


def _precise(tokenizer: str, **top: Any) -> Callable[[list[str]], dict[str, Any]]:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = profile(urls, tokenizer=tokenizer, **top)
        # The test sets each backend's stream itself: the pool follows no publisher of its own
        # (whose /kv_event_sources questions the fake backends would count as requests).
        data["pools"]["interactive"]["kv_events"] = {"follow": False}
        for cls in INTERACTIVE:
            data["lanes"][cls]["balance"] = {"strategy": "precise_prefix"}
        return data

    return shape


@asynccontextmanager
async def _stack(tokenizer: str, **top: Any) -> AsyncIterator[Stack]:
    async with router_stack(n_backends=2, shape=_precise(tokenizer, **top)) as s:
        yield s


def _holding(token_ids: list[int], salt: str | None = None) -> Stream:
    """A connected stream whose engine stored the prompt's full blocks (salted by `salt`)."""
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
                salt=salt,
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


def _salt(key: str) -> str:
    return cache_salt(KeyConfig(name=key, sha256=hash_key(KEYS[key])))


async def test_a_salted_request_goes_where_its_salts_blocks_are_never_another_salts() -> None:
    # Each key's requests carry its own cache salt. The engines hold the same prompt's blocks,
    # one salted as "user"'s requests are, the other as "tester"'s: each key's request goes to
    # the engine holding its own salt's blocks, wherever they move.
    body = {"model": MODEL, "prompt": TEXT}
    ids = parse_generation(
        body, "completion", served_models=[MODEL], max_model_len=1 << 20, priority_enabled=False
    ).prompt_token_ids
    assert len(ids) >= 4 * BLOCK
    async with _stack("simulator", prefix_cache_isolation="per_key") as stack:
        pool = stack.state.runtime.pools["interactive"]
        names = [b.name for b in pool.backends]
        async with stack.client() as client:
            for holder in (0, 1, 0):
                for key, other in (("user", "tester"), ("tester", "user")):
                    pool.kv.streams[names[holder]] = _holding(ids, _salt(key))
                    pool.kv.streams[names[1 - holder]] = _holding(ids, _salt(other))
                    before = _received(stack)
                    response = await client.post(
                        "/v1/completions", json={**body, "max_tokens": 8}, headers=auth(key)
                    )
                    assert response.status_code == 200, response.text
                    sent = [after - earlier for after, earlier in zip(_received(stack), before, strict=True)]
                    backend = stack.backend_urls.index(names[holder])
                    assert sent == [int(i == backend) for i in range(len(sent))], (holder, key)


async def test_unsalted_blocks_are_not_credited_to_a_salted_request() -> None:
    body = {"model": MODEL, "prompt": TEXT}
    ids = parse_generation(
        body, "completion", served_models=[MODEL], max_model_len=1 << 20, priority_enabled=False
    ).prompt_token_ids
    async with _stack("simulator", prefix_cache_isolation="per_key") as stack:
        pool = stack.state.runtime.pools["interactive"]
        names = [b.name for b in pool.backends]
        async with stack.client() as client:
            for holder in (0, 1, 0):
                # The salted blocks on one engine, the same prompt's unsalted blocks on the other.
                pool.kv.streams[names[holder]] = _holding(ids, _salt("user"))
                pool.kv.streams[names[1 - holder]] = _holding(ids)
                before = _received(stack)
                response = await client.post(
                    "/v1/completions", json={**body, "max_tokens": 8}, headers=auth("user")
                )
                assert response.status_code == 200, response.text
                sent = [after - earlier for after, earlier in zip(_received(stack), before, strict=True)]
                backend = stack.backend_urls.index(names[holder])
                assert sent == [int(i == backend) for i in range(len(sent))], holder


def test_a_prompt_whose_blocks_the_engine_keys_with_more_than_its_tokens_has_no_ids(tmp_path: Path) -> None:
    counter = counter_for(find_tokenizer("m", str(model_dir(tmp_path)), None, {}), PromptCosts())
    chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": TEXT}]})
    facts = parse_facts("chat", chat, counter)
    assert facts.token_ids

    assert engine_token_ids(counter, facts, None) == facts.token_ids
    assert engine_token_ids(counter, facts, AdapterNeed("sql-lora", None, True)) == ()
    odd = orjson.dumps({"model": "m", "prompt": TEXT, "cache_salt": 7})
    assert engine_token_ids(counter, parse_facts("completions", odd, counter), None) == ()
    plain = orjson.dumps({"model": "m", "prompt": TEXT})
    assert engine_token_ids(counter, parse_facts("completions", plain, counter), None) == (
        TOKENIZER.encode(TEXT, add_special_tokens=True).ids
    )


def test_the_salt_a_prompt_is_looked_up_with_is_the_one_the_engine_receives(tmp_path: Path) -> None:
    counter = counter_for(find_tokenizer("m", str(model_dir(tmp_path)), None, {}), PromptCosts())
    salted = parse_facts(
        "completions", orjson.dumps({"model": "m", "prompt": TEXT, "cache_salt": "mine"}), counter
    )
    plain = parse_facts("completions", orjson.dumps({"model": "m", "prompt": TEXT}), counter)
    assert engine_token_ids(counter, salted, None) == engine_token_ids(counter, plain, None) != ()
    assert engine_salt(salted, None) == "mine"
    assert engine_salt(salted, "the-keys") == "the-keys"  # the key's replaces the client's
    assert engine_salt(plain, None) is None
