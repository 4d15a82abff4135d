"""The security boundary: keys, scopes and the route allowlist, on a real server."""

from __future__ import annotations

import pytest

from tests.conftest import Stack
from tests.support.profiles import KEYS, MODEL, UPSTREAM_KEY, auth

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

# (method, path, body, scope needed: None = any valid key)
KEYED_ROUTES = [
    ("POST", "/v1/chat/completions", CHAT, None),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}, None),
    ("POST", "/v1/embeddings", {"model": MODEL, "input": "hi"}, None),
    ("GET", "/v1/models", None, None),
    ("GET", "/metrics", None, "metrics"),
    ("GET", "/admin/lanes", None, "admin"),
    ("POST", "/admin/reload", None, "admin"),
]


def _envelope(resp_json: dict[str, object]) -> dict[str, object]:
    err = resp_json["error"]
    assert isinstance(err, dict)
    assert set(err) >= {"message", "type", "code"}
    return err


@pytest.mark.parametrize(("method", "path", "body", "scope"), KEYED_ROUTES)
async def test_every_keyed_route_refuses_missing_and_wrong_keys(
    stack: Stack, method: str, path: str, body: object, scope: str | None
) -> None:
    async with stack.client() as client:
        missing = await client.request(method, path, json=body)
        wrong = await client.request(method, path, json=body, headers={"authorization": "Bearer nope"})
        basic = await client.request(method, path, json=body, headers={"authorization": "Basic dXNlcg=="})
    for resp in (missing, wrong, basic):
        assert resp.status_code == 401
        assert _envelope(resp.json())["type"] == "authentication_error"
    assert stack.forwarded() == 0


@pytest.mark.parametrize(("method", "path", "body", "scope"), [r for r in KEYED_ROUTES if r[3]])
async def test_scoped_routes_refuse_a_key_without_the_scope(
    stack: Stack, method: str, path: str, body: object, scope: str
) -> None:
    async with stack.client() as client:
        resp = await client.request(method, path, json=body, headers=auth("user"))
    assert resp.status_code == 403
    assert _envelope(resp.json())["type"] == "permission_error"


async def test_metrics_scope_reads_metrics_but_not_admin(stack: Stack) -> None:
    async with stack.client() as client:
        metrics = await client.get("/metrics", headers=auth("scraper"))
        admin = await client.get("/admin/lanes", headers=auth("scraper"))
        ops = await client.get("/metrics", headers=auth("ops"))
    assert metrics.status_code == 200 and ops.status_code == 200
    assert "lane_router_requests_total" in metrics.text
    assert admin.status_code == 403


async def test_probes_need_no_key_and_say_nothing_about_backends(stack: Stack) -> None:
    async with stack.client() as client:
        health = await client.get("/health")
        ready = await client.get("/ready")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code in (200, 503)
    assert set(ready.json()) == {"status"}
    for url in stack.backend_urls:
        assert url.split("//")[1] not in ready.text


HIDDEN_PATHS = [
    "/invocations",
    "/pooling",
    "/generative_scoring",
    "/version",
    "/load",
    "/ping",
    "/openapi.json",
    "/docs",
    "/pause",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/sleep",
    "/start_profile",
    "//v1/chat/completions",
    "/v1//chat/completions",
    "/v1/../invocations",
    "/v1/chat/../../invocations",
    "/V1/chat/completions",
    "/v1/chat/completions/",
    "/v1/chat%2Fcompletions",
    "/%761/chat/completions",
    "/v1/chat/completions/../../../metrics",
    "/admin",
    "/admin/",
    "/admin/unknown",
]


@pytest.mark.parametrize("key", [None, "user", "ops"])
async def test_only_allowlisted_routes_exist(stack: Stack, key: str | None) -> None:
    headers = auth(key) if key else {}
    for path in HIDDEN_PATHS:
        for method in ("GET", "POST"):
            status, body = await _raw_request(stack.url, method, path, headers, b'{"model":"fake-model"}')
            assert status == 404, (method, path, status, body)
            assert b'"error"' in body
    assert stack.forwarded() == 0


# vLLM routes the router serves only to keys whose `routes:` name them: no default key may.
SCOPED_PATHS = [
    "/tokenize",
    "/detokenize",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/responses",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
]


async def test_scoped_routes_need_a_key_with_their_scope(stack: Stack) -> None:
    for path in SCOPED_PATHS:
        status, body = await _raw_request(stack.url, "POST", path, {}, b'{"model":"fake-model"}')
        assert status == 401, (path, status, body)
        for key in ("user", "ops", "chat-only"):
            status, body = await _raw_request(stack.url, "POST", path, auth(key), b'{"model":"fake-model"}')
            assert status == 403, (path, key, status, body)
            assert b"route_scope_required" in body
    assert stack.forwarded() == 0


async def _raw_request(
    url: str, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, bytes]:
    """Send the path exactly as written: HTTP clients normalise `..` and `//` before sending."""
    import asyncio

    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {len(body)}\r\n"
        head += "connection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


async def test_wrong_method_is_405_with_allow(stack: Stack) -> None:
    async with stack.client() as client:
        resp = await client.get("/v1/chat/completions", headers=auth("user"))
    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"
    assert stack.forwarded() == 0


async def test_client_key_is_replaced_by_the_pool_key(stack: Stack) -> None:
    async with stack.client() as client:
        resp = await client.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={
                **auth("user"),
                "x-request-id": "req-42",
                "cookie": "a=b",
                "x-forwarded-for": "10.0.0.1",
            },
        )
    assert resp.status_code == 200
    seen = [s for b in stack.backends for s in b.seen]
    assert len(seen) == 1
    headers = seen[0].headers
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert KEYS["user"] not in str(headers)
    assert "cookie" not in headers
    # Namespaced under the key upstream (two tenants' ids never meet in vLLM), as sent to the client.
    assert headers["x-request-id"] == "user:req-42"
    assert resp.headers["x-request-id"] == "req-42"
    assert seen[0].path == "/v1/chat/completions"


async def test_request_id_is_generated_when_absent_or_unsafe(stack: Stack) -> None:
    async with stack.client() as client:
        plain = await client.post("/v1/chat/completions", json=CHAT, headers=auth("user"))
        unsafe = await client.post(
            "/v1/chat/completions", json=CHAT, headers={**auth("user"), "x-request-id": "x" * 500}
        )
    ids = [s.headers["x-request-id"].removeprefix("user:") for b in stack.backends for s in b.seen]
    assert plain.headers["x-request-id"] in ids and unsafe.headers["x-request-id"] in ids
    assert len(set(ids)) == 2 and all(len(i) == 24 for i in ids)


async def test_two_keys_sending_one_request_id_reach_the_backend_as_two(stack: Stack) -> None:
    async with stack.client() as client:
        for key in ("user", "tester"):
            resp = await client.post(
                "/v1/chat/completions", json=CHAT, headers={**auth(key), "x-request-id": "same"}
            )
            assert resp.headers["x-request-id"] == "same"
    assert sorted(s.headers["x-request-id"] for s in stack.seen()) == ["tester:same", "user:same"]


@pytest.mark.parametrize("header", ["authorization", "x-request-class", "x-client-id", "x-session-id"])
async def test_a_second_copy_of_a_deciding_header_is_refused(stack: Stack, header: str) -> None:
    key = auth("tester")["authorization"]
    if header == "authorization":
        headers = [("authorization", key), ("authorization", auth("user")["authorization"])]
    else:
        headers = [("authorization", key), (header, "chat"), (header, "rag")]
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "duplicate_header"
    assert stack.forwarded() == 0


async def test_key_limited_to_a_class_gets_403_for_others_and_nothing_is_forwarded(stack: Stack) -> None:
    agent = {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    async with stack.client() as client:
        chat = await client.post("/v1/chat/completions", json=CHAT, headers=auth("chat-only"))
        refused = await client.post("/v1/chat/completions", json=agent, headers=auth("chat-only"))
    assert chat.status_code == 200
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "class_not_allowed"
    assert stack.forwarded() == 1


async def test_key_limited_to_models_and_unknown_models(stack: Stack) -> None:
    other = {**CHAT, "model": "other-model"}
    async with stack.client() as client:
        limited = await client.post("/v1/chat/completions", json=other, headers=auth("chat-only"))
        unknown = await client.post("/v1/chat/completions", json=other, headers=auth("user"))
        models = await client.get("/v1/models", headers=auth("user"))
    assert limited.status_code == 403 and limited.json()["error"]["code"] == "model_not_allowed"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert [m["id"] for m in models.json()["data"]] == [MODEL]
    assert stack.forwarded() == 0


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions", {"echo": True, "logprobs": True, "top_logprobs": 20}),
        ("/v1/completions", {"echo": True, "logprobs": 20}),
        ("/v1/chat/completions", {"prompt_logprobs": -1}),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}),
        ("/v1/chat/completions", {"prompt_logprobs": True}),
        ("/v1/completions", {"echo": True, "logprobs": True}),
    ],
)
async def test_prompt_logprobs_beyond_the_keys_bound_are_refused_however_asked(
    stack: Stack, path: str, fields: dict[str, object]
) -> None:
    base: dict[str, object] = (
        dict(CHAT) if "chat" in path else {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    )
    async with stack.client() as client:
        resp = await client.post(path, json={**base, **fields}, headers=auth("user"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "field_limit_exceeded"
    assert stack.forwarded() == 0


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions", {"logprobs": True, "logprob_token_ids": list(range(128))}),
        ("/v1/completions", {"logprobs": 1, "logprob_token_ids": list(range(128))}),
    ],
)
async def test_listed_logprob_tokens_beyond_the_keys_width_are_refused(
    stack: Stack, path: str, fields: dict[str, object]
) -> None:
    base: dict[str, object] = (
        dict(CHAT) if "chat" in path else {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    )
    async with stack.client() as client:
        resp = await client.post(path, json={**base, **fields}, headers=auth("user"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "field_limit_exceeded"
    assert stack.forwarded() == 0


async def test_an_output_grammar_beyond_the_keys_bound_is_refused(stack: Stack) -> None:
    # vLLM compiles the schema before it generates, in time that grows faster than its size.
    props = {f"p{i}": {"type": "string", "pattern": "[a-z]{1,50}(x|y){2,20}"} for i in range(600)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    body = {
        **CHAT,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=body, headers=auth("user"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "field_limit_exceeded"
    assert stack.forwarded() == 0


async def test_repetition_detection_is_refused_to_a_key_without_leave(stack: Stack) -> None:
    body = {**CHAT, "repetition_detection": {"max_pattern_size": 1_000_000_000, "min_count": 2}}
    async with stack.client() as client:
        resp = await client.post("/v1/chat/completions", json=body, headers=auth("user"))
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "field_not_allowed"
    assert stack.forwarded() == 0


@pytest.mark.parametrize("fields", [{}, {"n": 8}, {"max_completion_tokens": None}])
async def test_a_request_stating_no_bound_is_classed_by_the_bound_the_router_writes(
    stack: Stack, fields: dict[str, object]
) -> None:
    # The router writes the pool's context (2048) as the bound: a large generation, as if stated.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], **fields}
    async with stack.client() as client:
        refused = await client.post("/v1/chat/completions", json=body, headers=auth("chat-only"))
        stated = await client.post(
            "/v1/chat/completions", json={**body, "max_tokens": 16}, headers=auth("chat-only")
        )
        batch = await client.post("/v1/chat/completions", json=body, headers=auth("user"))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "class_not_allowed"
    assert stated.status_code == 200, stated.text
    assert batch.status_code == 200, batch.text
    assert (batch.headers["x-lane-router-class"], batch.headers["x-lane-router-reason"]) == (
        "batch",
        "large_generation",
    )
    assert stack.forwarded() == 2
