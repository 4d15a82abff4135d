"""A chunked request's trailer and its transfer codings, on real sockets: trailer fields never
join the request's headers (whether they arrive in the read that ends the body or in a later
one), the trailer is bounded like a head by size and time, and a transfer coding other than
`chunked` is refused before the body is read. On the server with a test app, and on the router
in front of its fake backends, where a trailer could otherwise carry a key or a class."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from router.app.asgi import Receive, Scope, Send, send_json
from tests.conftest import Stack, router_stack
from tests.httpserver.apps import Scripted, read_all
from tests.httpserver.raw import FedBytes, Raw, Response, ask, request, serving
from tests.support.profiles import KEYS, MODEL

HEAD_LIMIT = 64 * 1024
LAST_CHUNK = b"0\r\n\r\n"  # and an empty trailer
CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})


def chunked_head(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", "Transfer-Encoding: chunked", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def one_write_and_split(port: int, fed: FedBytes, before: bytes, after: bytes) -> list[Response]:
    """The request sent twice: in one write, and as `before` then, once the server has fed all
    of it to its parser (so the two are surely separate reads), `after`."""
    whole = await ask(port, before + after)
    client = await Raw.open(port)
    try:
        client.send(before)
        async with asyncio.timeout(10):
            while fed.by_client[client.port] < len(before):
                await asyncio.sleep(0.01)
        client.send(after)
        split = await client.response()
    finally:
        client.close()
    return [whole, split]


def bearer(name: str) -> str:
    return f"Authorization: Bearer {KEYS[name]}"


# -- on the server ------------------------------------------------------------------------------


async def test_trailer_fields_never_reach_the_apps_headers(monkeypatch: Any) -> None:
    fed = FedBytes().install(monkeypatch)
    async with serving() as server:
        before = chunked_head("POST", "/up", "X-Head: h") + chunk(b"hello") + b"0\r\n"
        after = b"X-Trailer: t\r\nX-Head: again\r\n\r\n"
        answers = await one_write_and_split(server.port, fed, before, after)
        # The connection reads on after a trailer: the request behind it is served.
        client = await Raw.open(server.port)
        client.send(before + after + request("GET", "/after"))
        answers += [await client.response(), await client.response()]
        client.close()
    for resp in answers[:3]:
        seen = orjson.loads(resp.body)
        assert seen["body"] == "hello"
        assert seen["headers"] == [["host", "test"], ["transfer-encoding", "chunked"], ["x-head", "h"]]
    assert orjson.loads(answers[3].body)["path"] == "/after"


async def test_an_endless_trailer_is_refused_with_431_after_the_head_limit(monkeypatch: Any) -> None:
    fed = FedBytes().install(monkeypatch)
    one_field = b"0\r\nX-Endless: " + b"a" * (16 << 20)  # a field that never ends
    many_fields = b"0\r\n" + b"".join(
        b"X-T%d: v\r\n" % i for i in range(1_500_000)
    )  # each ends, the trailer not
    answers = []
    async with serving() as server:
        for endless in (one_field, many_fields):
            attacker = await Raw.open(server.port)
            attacker.send(chunked_head("POST", "/up") + chunk(b"hello") + endless)
            resp = await attacker.response()
            unsent_when_refused = attacker.writer.transport.get_write_buffer_size()
            assert await attacker.closed() == b""
            attacker.close()
            answers.append((resp, fed.by_client[attacker.port], unsent_when_refused))
        assert (await ask(server.port, request("GET", "/"))).status == 200
    for resp, fed_bytes, unsent_when_refused in answers:
        assert resp.status == 431
        assert resp.headers["connection"] == "close"
        error = orjson.loads(resp.body)["error"]
        assert error["code"] == "request_header_fields_too_large"
        assert "trailer" in error["message"]
        # What the parser was fed (and so could hold): the read with the head, then the limit.
        assert fed_bytes <= 2 * HEAD_LIMIT
        assert unsent_when_refused > 1 << 20  # the client was far from done sending


async def test_a_slow_trailer_gets_408_at_the_head_deadline_however_steadily_it_trickles() -> None:
    async with serving(head_timeout_s=1.0, body_timeout_s=10.0) as server:
        client = await Raw.open(server.port)
        client.send(chunked_head("POST", "/up") + chunk(b"hello") + b"0\r\nX-Slow: ")

        async def trickle() -> None:
            while True:  # a byte well inside every body stall timeout, for as long as it is read
                await asyncio.sleep(0.1)
                client.send(b"a")

        trickling = asyncio.create_task(trickle())
        try:
            resp = await client.response()
        finally:
            trickling.cancel()
        client.close()
    assert resp.status == 408
    error = orjson.loads(resp.body)["error"]
    assert error["code"] == "request_timeout"
    assert "trailer" in error["message"]


async def test_a_trailer_trickled_a_whole_field_a_write_gets_408_at_the_head_deadline() -> None:
    """Each write ends with a line end, as a size line with its data still to come would: the
    fields still tell a trailer."""
    async with serving(head_timeout_s=1.0, body_timeout_s=10.0) as server:
        client = await Raw.open(server.port)
        client.send(chunked_head("POST", "/up") + chunk(b"hello") + b"0\r\n")

        async def trickle() -> None:
            for i in range(1000):  # a field well inside every body stall timeout
                await asyncio.sleep(0.1)
                client.send(b"X-Slow-%d: v\r\n" % i)

        trickling = asyncio.create_task(trickle())
        try:
            resp = await client.response()
        finally:
            trickling.cancel()
        client.close()
    assert resp.status == 408
    assert "trailer" in orjson.loads(resp.body)["error"]["message"]


async def test_a_chunks_data_after_its_size_line_has_the_bodys_time_not_the_heads(monkeypatch: Any) -> None:
    """A size line with nothing after it may be a chunk's whose data is yet to come: the wait
    is a body's (the stall timeout), not a trailer's."""
    fed = FedBytes().install(monkeypatch)
    async with serving(head_timeout_s=1.0, body_timeout_s=10.0) as server:
        client = await Raw.open(server.port)
        before = chunked_head("POST", "/up") + chunk(b"hel") + b"2\r\n"
        client.send(before)
        async with asyncio.timeout(10):
            while fed.by_client[client.port] < len(before):
                await asyncio.sleep(0.01)
        await asyncio.sleep(2.0)  # past the head deadline, well inside the body's
        client.send(b"lo\r\n" + LAST_CHUNK)
        resp = await client.response()
        client.close()
    assert resp.status == 200
    assert orjson.loads(resp.body)["body"] == "hello"


async def test_a_trailer_held_back_by_a_slow_app_is_not_late() -> None:
    """Reading pauses while the app has not taken the body: the trailer's clock runs only while
    the server reads."""
    go = asyncio.Event()

    async def slow(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        app.note("started")
        await go.wait()
        first = await receive()  # reading resumes
        app.note("took")
        rest, _ = await read_all(receive)
        await send_json(send, 200, {"got": len(first["body"]) + len(rest)})

    app = Scripted({"/up": slow})
    async with serving(app, head_timeout_s=1.5, body_buffer_bytes=1024) as server:
        client = await Raw.open(server.port)
        # The body fills the buffer, so reading pauses in the trailer's first read.
        client.send(chunked_head("POST", "/up") + chunk(b"b" * 4096) + b"0\r\nX-Late: y")
        await app.wait_for("started")
        await asyncio.sleep(2.0)  # the slow app: longer than the head deadline
        go.set()
        await app.wait_for("took")
        client.send(b"es\r\n\r\n")
        resp = await client.response()
        client.close()
    assert resp.status == 200
    assert orjson.loads(resp.body) == {"got": 4096}


async def test_chunk_framing_is_bounded_per_chunk_not_per_body() -> None:
    async with serving() as server:
        many = b"".join(chunk(b"z") for _ in range(30_000))  # 180 KB of framing for 30 KB of data
        resp = await ask(server.port, chunked_head("POST", "/up") + many + LAST_CHUNK)
        endless = await ask(
            server.port, chunked_head("POST", "/up") + b"5;" + b"x" * (1 << 20) + b"\r\nhello"
        )
    assert resp.status == 200
    assert orjson.loads(resp.body)["body"] == "z" * 30_000
    assert endless.status == 400
    assert orjson.loads(endless.body)["error"]["code"] == "invalid_request"


# Each a transfer coding the server does not decode.
UNKNOWN_CODINGS = {
    "gzip before chunked": ["gzip, chunked"],
    "in capitals, no space": ["GZIP,Chunked"],
    "with odd spaces": ["x-gzip , chunked"],
    "identity before chunked": ["identity, chunked"],
    "identity alone": ["identity"],
    "gzip alone": ["gzip"],
    "a parameter on chunked": ["chunked;q=1"],
    "in two fields": ["gzip", "chunked"],
    "an unknown name": ["xchunked"],
}
# Framings the parser itself refuses as malformed.
MALFORMED_CODINGS = {
    "chunked before gzip": ["chunked, gzip"],
    "chunked twice": ["chunked, chunked"],
    "chunked twice in two fields": ["chunked", "chunked"],
    "an empty value": [""],
}
PLAIN_CHUNKED = {"lower": ["chunked"], "capitals": ["CHUNKED"], "an empty element first": [", chunked"]}


def coded(values: list[str], body: bytes = b"hello") -> bytes:
    lines = ["POST /up HTTP/1.1", "Host: test", *(f"Transfer-Encoding: {v}" for v in values)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + chunk(body) + LAST_CHUNK


@pytest.mark.parametrize("shape", list(UNKNOWN_CODINGS) + list(MALFORMED_CODINGS))
async def test_a_transfer_coding_other_than_chunked_is_refused_before_the_app(shape: str) -> None:
    calls: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            calls.append(scope["path"])
            await read_all(receive)

    async with serving(Scripted({"/up": app})) as server:
        client = await Raw.open(server.port)
        client.send(coded(UNKNOWN_CODINGS.get(shape) or MALFORMED_CODINGS[shape]) + request("GET", "/behind"))
        resp = await client.response()
        rest = await client.closed()
        client.close()
    assert resp.status == (501 if shape in UNKNOWN_CODINGS else 400)
    error = orjson.loads(resp.body)["error"]
    assert error["code"] == ("unsupported_transfer_coding" if shape in UNKNOWN_CODINGS else "invalid_request")
    assert resp.headers["connection"] == "close"
    assert rest == b""  # nothing after the refusal: neither the body nor the request behind it
    assert calls == []


@pytest.mark.parametrize("shape", list(PLAIN_CHUNKED))
async def test_chunked_alone_is_read_however_it_is_spelled(shape: str) -> None:
    async with serving() as server:
        resp = await ask(server.port, coded(PLAIN_CHUNKED[shape]))
    assert resp.status == 200
    assert orjson.loads(resp.body)["body"] == "hello"


# -- on the router --------------------------------------------------------------------------------


async def test_a_key_only_in_a_trailer_is_no_key(stack: Stack, monkeypatch: Any) -> None:
    fed = FedBytes().install(monkeypatch)
    port = int(stack.url.rsplit(":", 1)[1])
    chat = chunked_head("POST", "/v1/chat/completions", "Content-Type: application/json") + chunk(CHAT)
    admin = chunked_head("GET", "/admin/lanes")
    answers = await one_write_and_split(port, fed, chat + b"0\r\n", f"{bearer('user')}\r\n\r\n".encode())
    admin_answers = await one_write_and_split(
        port, fed, admin + b"0\r\n", f"{bearer('ops')}\r\n\r\n".encode()
    )
    assert [r.status for r in answers] == [401, 401]
    assert [r.status for r in admin_answers] == [401, 401]
    for resp in answers + admin_answers:
        assert orjson.loads(resp.body)["error"]["type"] == "authentication_error"
    assert stack.forwarded() == 0


async def test_a_class_named_in_a_trailer_is_not_the_requests(stack: Stack, monkeypatch: Any) -> None:
    fed = FedBytes().install(monkeypatch)
    port = int(stack.url.rsplit(":", 1)[1])
    head = chunked_head("POST", "/v1/chat/completions", bearer("tester"), "Content-Type: application/json")
    answers = await one_write_and_split(
        port, fed, head + chunk(CHAT) + b"0\r\n", b"X-Request-Class: batch\r\n\r\n"
    )
    assert [r.status for r in answers] == [200, 200]
    assert [r.headers["x-lane-router-class"] for r in answers] == ["chat", "chat"]
    assert [r.headers["x-lane-router-reason"] for r in answers] == ["default", "default"]
    assert stack.forwarded() == 2


async def test_a_key_in_the_head_is_the_key_whatever_the_trailer_says(stack: Stack, monkeypatch: Any) -> None:
    fed = FedBytes().install(monkeypatch)
    port = int(stack.url.rsplit(":", 1)[1])
    head = chunked_head("POST", "/v1/chat/completions", bearer("user"), "Content-Type: application/json")
    answers = await one_write_and_split(
        port, fed, head + chunk(CHAT) + b"0\r\n", f"{bearer('ops')}\r\n\r\n".encode()
    )
    assert [r.status for r in answers] == [200, 200]
    # The backend was asked on behalf of the head's key, as its request id says.
    assert [s.headers["x-request-id"].split(":")[0] for s in stack.seen()] == ["user", "user"]


async def test_a_gzip_coded_body_is_refused_with_501_and_reaches_no_backend(stack: Stack) -> None:
    port = int(stack.url.rsplit(":", 1)[1])
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"{bearer('user')}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    ).encode()
    resp = await ask(port, head + chunk(CHAT) + LAST_CHUNK)
    assert resp.status == 501
    assert orjson.loads(resp.body)["error"]["code"] == "unsupported_transfer_coding"
    assert stack.forwarded() == 0


async def test_a_chunked_request_on_another_asgi_server_is_refused_with_411_before_its_key_is_read() -> None:
    """uvicorn's httptools protocol appends a trailer's fields to the head's, in the list the
    app reads: under a server that is not its own, the router takes no chunked request."""
    chat = chunked_head("POST", "/v1/chat/completions", "Content-Type: application/json") + chunk(CHAT)
    keyed = chunked_head("POST", "/v1/chat/completions", bearer("user"), "Content-Type: application/json")
    async with router_stack(on_uvicorn=True) as stack:
        port = int(stack.url.rsplit(":", 1)[1])
        key_in_trailer = await ask(port, chat + b"0\r\n" + f"{bearer('user')}\r\n\r\n".encode())
        key_in_head = await ask(port, keyed + chunk(CHAT) + LAST_CHUNK)
        async with stack.client() as client:
            with_length = await client.post(
                "/v1/chat/completions", content=CHAT, headers={"authorization": f"Bearer {KEYS['user']}"}
            )
        forwarded = stack.forwarded()
    for resp in (key_in_trailer, key_in_head):
        assert resp.status == 411
        assert orjson.loads(resp.body)["error"]["code"] == "length_required"
    assert with_length.status_code == 200
    assert forwarded == 1
