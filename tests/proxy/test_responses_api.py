"""The Responses API through the router, against fake backends that keep stored responses in
their own memory as vLLM does: conversations stay on the backend that holds them, ids are
reachable only by the key that created them, streams arrive as sent, a client that goes away
aborts the backend's request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest
from openai import AsyncOpenAI

from router.fleet.backend import Health
from router.proxy.conversation import conversation_tokens
from router.request.tokens import NO_MEDIA
from tests.conftest import Stack
from tests.proxy.apistack import api_profile, api_stack, bearer, client, sdk, write_profile
from tests.support.fakebackend import Seen

pytestmark = pytest.mark.timeout(60)
MODEL = "fake-model"


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with api_stack(config_dir=tmp_path) as s:
        yield s


def _last(stack: Stack) -> Seen:
    return max(stack.seen(), key=lambda s: s.started)


def _text(response: object) -> str:
    return str(response.output_text)


async def test_a_three_turn_conversation_stays_on_the_backend_that_holds_it(stack: Stack) -> None:
    async with sdk(stack.url) as api:
        await _three_turns(api)
    assert sum(len(b.api.stored) for b in stack.backends) == 12


async def _three_turns(api: AsyncOpenAI) -> None:
    firsts = [await api.responses.create(model=MODEL, input=f"hello {i}") for i in range(4)]
    # Fresh conversations are spread over both backends…
    assert {_text(r).split(" on ")[1] for r in firsts} == {"b0", "b1"}
    for first in firsts:
        where = _text(first).split(" on ")[1]
        second = await api.responses.create(model=MODEL, input="and then?", previous_response_id=first.id)
        third = await api.responses.create(model=MODEL, input="and then?", previous_response_id=second.id)
        # …and each continues where it began: the holder counted all three turns.
        assert _text(second) == f"turn 2 on {where}"
        assert _text(third) == f"turn 3 on {where}"


async def test_the_router_writes_the_output_bound_into_max_output_tokens(stack: Stack) -> None:
    async with client(stack.url) as http:
        resp = await http.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert resp.status_code == 200
        sent = orjson.loads(_last(stack).body)
        assert sent["max_output_tokens"] == 2048  # the pool's context: no lane or key bound
        assert "max_tokens" not in sent
        resp = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 7})
        assert orjson.loads(_last(stack).body)["max_output_tokens"] == 7


async def test_a_follow_up_counts_the_conversation_as_the_backend_reported_it(stack: Stack) -> None:
    async with client(stack.url) as http:
        first = await http.post(
            "/v1/responses", json={"model": MODEL, "input": "x" * 100, "max_output_tokens": 50}
        )
        alone = await http.post("/v1/responses", json={"model": MODEL, "input": "y" * 10})
        body = {"model": MODEL, "input": "y" * 10, "previous_response_id": first.json()["id"]}
        follow = await http.post("/v1/responses", json=body)
        streamed = {**body, "stream": True}
        async with http.stream("POST", "/v1/responses", json=streamed) as resp:
            events = [
                orjson.loads(line[6:]) async for line in resp.aiter_lines() if line.startswith("data: ")
            ]
        body["previous_response_id"] = events[-1]["response"]["id"]
        third = await http.post("/v1/responses", json=body)
    own = int(alone.headers["x-lane-router-prompt-tokens"])
    # The template's tokens around the previous output, rendered again as an assistant message.
    reply = stack.state.runtime.counter.message("assistant", "", "", NO_MEDIA)
    # The previous turn's usage (the conversation's input tokens and its output), not the bounds
    # its request was given: its prompt bound and 50 output tokens.
    used = first.json()["usage"]["input_tokens"] + first.json()["usage"]["output_tokens"]
    assert used + reply < int(first.headers["x-lane-router-prompt-tokens"]) + 50
    assert int(follow.headers["x-lane-router-prompt-tokens"]) == used + reply + own
    usage = events[-1]["response"]["usage"]  # a streamed turn's, from its response.completed event
    assert (
        int(third.headers["x-lane-router-prompt-tokens"])
        == usage["input_tokens"] + usage["output_tokens"] + reply + own
    )


async def test_without_a_usage_report_a_follow_up_counts_the_turns_bounds(stack: Stack) -> None:
    for backend in stack.backends:
        backend.api.report_usage = False
    async with client(stack.url) as http:
        first = await http.post(
            "/v1/responses", json={"model": MODEL, "input": "x" * 100, "max_output_tokens": 50}
        )
        alone = await http.post("/v1/responses", json={"model": MODEL, "input": "y" * 10})
        body = {"model": MODEL, "input": "y" * 10, "previous_response_id": first.json()["id"]}
        follow = await http.post("/v1/responses", json=body)
    before = int(first.headers["x-lane-router-prompt-tokens"])
    own = int(alone.headers["x-lane-router-prompt-tokens"])
    assert int(follow.headers["x-lane-router-prompt-tokens"]) == before + 50 + own


async def test_an_sdk_conversation_goes_on_without_max_output_tokens(tmp_path: Path) -> None:
    """The SDK states no output bound: the first turn gets the whole context as its written bound,
    which a follow-up's prompt bound must not inherit, or every follow-up outgrows the lane."""
    base = api_profile([])
    lanes = {**base["lanes"], "chat": {"pool": "interactive", "max_prompt_tokens": 1500}}
    # Prompts up to the whole context stay chat: the lane's shape is what refuses them.
    classify = {**base["classify"], "long_context_tokens": 4000}
    async with api_stack(lanes=lanes, classify=classify) as stack, sdk(stack.url) as api:
        first = await api.responses.create(model=MODEL, input="hello")
        where = _text(first).split(" on ")[1]
        second = await api.responses.create(model=MODEL, input="and then?", previous_response_id=first.id)
        third = await api.responses.create(model=MODEL, input="and then?", previous_response_id=second.id)
        assert _text(third) == f"turn 3 on {where}"
        assert first.max_output_tokens == 2048  # the router's written bound: the pool's context
    assert [s.path for s in stack.seen()] == ["/v1/responses"] * 3


async def test_streamed_events_arrive_as_sent_and_the_id_is_remembered(stack: Stack) -> None:
    async with client(stack.url) as http:
        body = {"model": MODEL, "input": "stream it", "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            received = b"".join([chunk async for chunk in resp.aiter_raw()])
    (backend,) = [b for b in stack.backends if b.api.sent]
    assert received == b"".join(backend.api.sent)
    created = orjson.loads(received.split(b"\n")[1].removeprefix(b"data: "))
    rid = created["response"]["id"]
    async with sdk(stack.url) as api:
        follow = await api.responses.create(model=MODEL, input="next", previous_response_id=rid)
    assert _text(follow) == f"turn 2 on {backend.api.tag}"


async def test_the_sdk_reads_a_streamed_response(stack: Stack) -> None:
    async with sdk(stack.url) as api:
        stream = await api.responses.create(model=MODEL, input="hi", stream=True)
        kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 4  # "turn 1 on bN"


async def test_retrieve_and_cancel_reach_the_holder_for_the_owner_only(stack: Stack) -> None:
    async with sdk(stack.url) as api:
        first = await api.responses.create(model=MODEL, input="keep me")
    async with client(stack.url) as mine, client(stack.url, "reader") as other:
        got = await mine.get(f"/v1/responses/{first.id}")
        assert got.status_code == 200 and got.json()["id"] == first.id
        streamed = await mine.get(f"/v1/responses/{first.id}?stream=false&starting_after=0")
        assert streamed.status_code == 200
        forwarded = stack.forwarded()
        for response in (
            await other.get(f"/v1/responses/{first.id}"),
            await other.post(f"/v1/responses/{first.id}/cancel"),
            await other.post(
                "/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": first.id}
            ),
            await mine.get("/v1/responses/resp_unknown123"),
            await mine.post(
                "/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}
            ),
        ):
            assert response.status_code == 404, response.text
            error = response.json()["error"]
            assert error["code"] == "response_not_found" and error["type"] == "not_found_error"
        assert stack.forwarded() == forwarded  # the router answered every one of them itself
        cancelled = await mine.post(f"/v1/responses/{first.id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        bad = await mine.get(f"/v1/responses/{first.id}?include=everything")
        assert bad.status_code == 400
    assert _last(stack).path == f"/v1/responses/{first.id}/cancel"


async def test_a_client_disconnect_aborts_the_backend_stream(stack: Stack) -> None:
    for backend in stack.backends:
        backend.api.itl_s = 1.0
    async with client(stack.url) as http:
        body = {"model": MODEL, "input": "slow", "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as resp:
            async for _ in resp.aiter_raw():
                break  # the first event arrived; the client goes away mid-stream
    await stack.wait_until(lambda: any(s.disconnected is not None for s in stack.seen()))
    (seen,) = stack.seen()
    assert seen.finished is None


_BUILTIN = "builtin_tools_not_supported"
_LIMIT = "field_limit_exceeded"
_BIG = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string", "pattern": "[a-z]{1,50}"} for i in range(1000)},
}


async def test_body_policy_applies_to_responses(stack: Stack) -> None:
    async with client(stack.url) as http:
        for body, status, code in [
            ({"input": "x", "background": True}, 400, "background_not_supported"),
            # Tools vLLM runs itself: a generation turn per call, the turns unbounded.
            ({"input": "x", "tools": [{"type": "code_interpreter"}]}, 400, "builtin_tools_not_supported"),
            # An output grammar beyond the key's bound: vLLM compiles it before generating.
            ({"input": "x", "text": {"format": {"type": "json_schema", "schema": _BIG}}}, 400, _LIMIT),
            ({"input": "x", "tools": [{"type": "web_search_preview"}]}, 400, "builtin_tools_not_supported"),
            (
                {"input": "x", "tools": [{"type": "mcp", "server_label": "python"}]},
                400,
                "builtin_tools_not_supported",
            ),
            ({"input": "x", "priority": -5}, 403, "field_not_allowed"),
            ({"input": "x", "cache_salt": "mine"}, 403, "field_not_allowed"),
            ({"input": "x", "prompt": {"id": "p"}}, 400, "unsupported_field"),
            ({"input": 5}, 400, "invalid_input"),
            ({"input": "x", "previous_response_id": "../../metrics"}, 400, "invalid_previous_response_id"),
        ]:
            resp = await http.post("/v1/responses", json={"model": MODEL, **body})
            assert (resp.status_code, resp.json()["error"]["code"]) == (status, code), body
    assert stack.forwarded() == 0


async def test_tools_make_an_agent_request(stack: Stack) -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    async with client(stack.url) as http:
        resp = await http.post("/v1/responses", json={"model": MODEL, "input": "x", "tools": tools})
    assert resp.headers["x-lane-router-class"] == "agent"
    assert resp.headers["x-lane-router-reason"] == "tools"


async def test_an_id_whose_backend_left_the_pool_is_404(stack: Stack) -> None:
    async with sdk(stack.url) as api:
        first = await api.responses.create(model=MODEL, input="hi")
    holder = next(b for b in stack.backends if first.id in b.api.stored)
    keep = [u for b, u in zip(stack.backends, stack.backend_urls, strict=True) if b is not holder]
    assert stack.config_path is not None
    write_profile(stack.config_path, api_profile(keep))
    assert (await stack.state.reload("test")).ok
    async with client(stack.url) as http:
        resp = await http.get(f"/v1/responses/{first.id}")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "response_not_found"


async def test_a_key_without_the_responses_scope_is_refused(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=bearer("user")) as http:
        resp = await http.post("/v1/responses", json={"model": MODEL, "input": "x"})
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "route_scope_required"
        resp = await http.get("/v1/responses/resp_abc")
        assert resp.status_code == 403
    assert stack.forwarded() == 0


async def test_a_named_response_id_another_key_holds_is_refused_before_the_backend(stack: Stack) -> None:
    async with sdk(stack.url) as api:
        first = await api.responses.create(model=MODEL, input="mine")
    where = _text(first)
    forwarded = stack.forwarded()
    async with client(stack.url) as owner, client(stack.url, "namer") as namer:
        for stream in (False, True):
            body = {"model": MODEL, "input": "x", "request_id": first.id, "stream": stream}
            resp = await namer.post("/v1/responses", json=body)
            assert resp.status_code == 409, resp.text
            assert resp.json()["error"]["code"] == "response_id_in_use"
        assert stack.forwarded() == forwarded
        got = await owner.get(f"/v1/responses/{first.id}")
        assert got.status_code == 200 and got.json()["output"][0]["content"][0]["text"] == where
        assert (await namer.get(f"/v1/responses/{first.id}")).status_code == 404
        # The X-Request-Id header names no response: vLLM names it after the body's request_id only.
        header = await namer.post(
            "/v1/responses", json={"model": MODEL, "input": "x"}, headers={"x-request-id": first.id}
        )
        assert header.status_code == 200 and header.json()["id"] != first.id
        assert (await owner.get(f"/v1/responses/{first.id}")).status_code == 200


async def test_a_named_response_id_is_bound_once_and_given_back_when_nothing_used_it(stack: Stack) -> None:
    async with client(stack.url, "namer") as namer, client(stack.url) as other:
        for bad in ("mine", "resp_../x", 5):
            resp = await namer.post("/v1/responses", json={"model": MODEL, "input": "x", "request_id": bad})
            assert (resp.status_code, resp.json()["error"]["code"]) == (400, "invalid_request_id")
        body = {"model": MODEL, "input": "x", "request_id": "resp_chosen1"}
        for backend in stack.backends:
            backend.behaviour.status = 500
        # No backend can say whether it holds the id: refused, and the claim given back.
        unchecked = await namer.post("/v1/responses", json=body)
        assert (unchecked.status_code, unchecked.json()["error"]["code"]) == (503, "response_ids_unavailable")
        for backend in stack.backends:
            backend.behaviour.status = 200
            backend.api.create_status = 500
        assert (await namer.post("/v1/responses", json=body)).status_code == 500
        for backend in stack.backends:
            backend.api.create_status = 200
        # The failed request made no response: its claim was given back, the id is free again.
        made = await namer.post("/v1/responses", json=body)
        assert made.status_code == 200 and made.json()["id"] == "resp_chosen1"
        follow = {"model": MODEL, "input": "y", "previous_response_id": "resp_chosen1"}
        assert (await namer.post("/v1/responses", json=follow)).status_code == 200
        # Now it is in use, for its owner too: vLLM would replace the response it names.
        again = await namer.post("/v1/responses", json=body)
        assert (again.status_code, again.json()["error"]["code"]) == (409, "response_id_in_use")
        assert (await other.get("/v1/responses/resp_chosen1")).status_code == 404
        assert (await namer.get("/v1/responses/resp_chosen1")).status_code == 200


async def test_a_named_id_a_backend_still_holds_is_refused_after_the_router_forgot_it() -> None:
    """The router remembers ids for a while (TTL, a cap, until it restarts); vLLM keeps stored
    responses until it restarts. An id the router forgot may still name another key's response
    there, which a request naming it does not replace when it says `store: false` (nor when its
    stream is cut short): bound to the namer, it would hand the namer the other key's response."""
    async with (
        api_stack(n_backends=1, response_ids={"max_entries": 16}) as stack,
        client(stack.url) as owner,
        client(stack.url, "namer") as namer,
    ):
        first = (await owner.post("/v1/responses", json={"model": MODEL, "input": "secret"})).json()
        for _ in range(16):  # the memory holds 16 ids: the first is pushed out
            assert (await owner.post("/v1/responses", json={"model": MODEL, "input": "x"})).status_code == 200
        assert (await owner.get(f"/v1/responses/{first['id']}")).status_code == 404
        assert first["id"] in stack.backends[0].api.stored
        for stream in (False, True):
            body = {"model": MODEL, "input": "x", "request_id": first["id"], "store": False, "stream": stream}
            resp = await namer.post("/v1/responses", json=body)
            assert (resp.status_code, resp.json()["error"]["code"]) == (409, "response_id_in_use")
        assert (await namer.get(f"/v1/responses/{first['id']}")).status_code == 404
        # An id no backend holds is named as before.
        body = {"model": MODEL, "input": "x", "request_id": "resp_fresh1", "store": False}
        assert (await namer.post("/v1/responses", json=body)).status_code == 200


async def test_a_follow_up_whose_backend_is_down_names_that_backend(stack: Stack) -> None:
    async with sdk(stack.url) as api:
        first = await api.responses.create(model=MODEL, input="hi")
    index = next(i for i, b in enumerate(stack.backends) if first.id in b.api.stored)
    stack.backends[index].healthy = False
    backend = stack.state.runtime.pools["interactive"].backends[index]
    async with asyncio.timeout(10):
        while backend.health is not Health.DOWN:
            await asyncio.sleep(0.02)
    async with client(stack.url) as http:
        fresh = await http.post("/v1/responses", json={"model": MODEL, "input": "x"})
        assert fresh.status_code == 200  # the pool has a healthy backend
        forwarded = stack.forwarded()
        follow = {"model": MODEL, "input": "x", "previous_response_id": first.id}
        for resp in (
            await http.post("/v1/responses", json=follow),
            await http.get(f"/v1/responses/{first.id}"),
        ):
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert error["code"] == "response_backend_unavailable"
            assert (
                f"pool 'interactive' backend {index}, which holds this response, is unhealthy"
                in error["message"]
            )
            assert int(resp.headers["retry-after"]) >= 1
        assert stack.forwarded() == forwarded


async def test_a_named_response_id_needs_shared_state_when_several_routers_serve() -> None:
    """Without `state:` each router process knows only its own ids, so none can tell whether
    another holds a named one for another key."""
    async with api_stack(replicas=2) as stack, client(stack.url, "namer") as namer:
        named = await namer.post(
            "/v1/responses", json={"model": MODEL, "input": "x", "request_id": "resp_n1"}
        )
        assert (named.status_code, named.json()["error"]["code"]) == (400, "request_id_unsupported")
        assert stack.forwarded() == 0
        assert (await namer.post("/v1/responses", json={"model": MODEL, "input": "x"})).status_code == 200


def test_a_usage_count_that_is_not_a_plain_integer_is_no_count() -> None:
    """A count the router would read only a prefix of (an exponent, a fraction, more digits than
    it reads) would make the conversation smaller than the backend said: none is taken, and the
    turn's bounds stand."""
    assert conversation_tokens(b'"usage":{"input_tokens":120,"output_tokens":30}}') == 150
    for odd in (b"1e9", b"12.5", b"-3", b'"7"', b"null", b"1234567890123"):
        tail = b'"usage":{"input_tokens":' + odd + b',"output_tokens":30}}'
        assert conversation_tokens(tail) is None, odd
