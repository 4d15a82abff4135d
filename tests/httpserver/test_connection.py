"""HTTP/1.1 and 1.0 on one connection, on real sockets: keep-alive, pipelining, request body
framings, HEAD, 100-continue, Upgrade, and the malformed and smuggling shapes refused with 400."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from router.app.asgi import Receive, Scope, Send, send_bytes, send_json
from tests.httpserver.apps import Scripted, read_all
from tests.httpserver.raw import FedBytes, Raw, request, serving


async def test_keep_alive_serves_many_requests_and_connection_close_ends_it() -> None:
    async with serving() as server:
        client = await Raw.open(server.port)
        for i in range(3):
            client.send(request("GET", f"/n/{i}"))
            resp = await client.response()
            assert orjson.loads(resp.body)["path"] == f"/n/{i}"
            assert "connection" not in resp.headers
        client.send(request("GET", "/last", b"", "Connection: close"))
        resp = await client.response()
        assert resp.status == 200
        assert resp.headers["connection"] == "close"
        assert await client.closed() == b""
        client.close()


async def test_each_request_on_a_kept_alive_connection_gets_a_scope_of_its_own() -> None:
    targets = ["/a?x=1", "/a?x=1", "/a%20b", "/a?x=1", "/p#frag"]
    scopes = []
    async with serving() as server:
        client = await Raw.open(server.port)
        for target in targets:
            method = "GET" if len(scopes) % 2 else "POST"
            client.send(request(method, target))
            scopes.append(orjson.loads((await client.response()).body))
        client.close()

    seen = [(s["method"], s["path"], s["raw_path"], s["query_string"]) for s in scopes]
    assert seen == [
        ("POST", "/a", "/a", "x=1"),
        ("GET", "/a", "/a", "x=1"),
        ("POST", "/a b", "/a%20b", ""),
        ("GET", "/a", "/a", "x=1"),
        ("POST", "/p", "/p", ""),
    ]
    assert all(s["http_version"] == "1.1" and s["scheme"] == "http" and s["root_path"] == "" for s in scopes)
    assert all(s["client"][0] == "127.0.0.1" and s["server"][1] == server.port for s in scopes)


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    release: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def slow(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        app.note("slow started")
        await release
        await send_bytes(send, 200, b"slow", b"text/plain")
        app.note("slow done")

    async def other(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        body, _ = await read_all(receive)
        app.note("other started", body)
        await send_bytes(send, 200, b"other:" + body, b"text/plain")

    app = Scripted({"/slow": slow, "/other": other})
    async with serving(app) as server:
        client = await Raw.open(server.port)
        client.send(request("GET", "/slow") + request("POST", "/other", b"abc") + request("GET", "/other"))
        await app.wait_for("slow started")
        assert [name for name, _ in app.events] == ["slow started"]  # the rest waits its turn
        release.set_result(None)
        answers = [await client.response() for _ in range(3)]
        client.close()

    assert [r.body for r in answers] == [b"slow", b"other:abc", b"other:"]
    names = [name for name, _ in app.events]
    assert names.index("slow done") < names.index("other started")


async def test_chunked_request_bodies_with_extensions_and_trailers_reach_the_app_whole() -> None:
    async with serving() as server:
        client = await Raw.open(server.port)
        head = b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        client.send(head + b"5;ext=1\r\nhello\r\n")
        client.send(b"6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n")
        resp = await client.response()
        assert orjson.loads(resp.body)["body"] == "hello world"
        client.send(request("GET", "/after"))  # the connection is still in step
        assert orjson.loads((await client.response()).body)["path"] == "/after"
        client.close()


async def test_a_large_body_arrives_in_pieces_bounded_by_the_body_buffer() -> None:
    sizes: list[int] = []

    async def upload(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        body, parts = await read_all(receive)
        sizes.extend(parts)
        await send_json(send, 200, {"got": len(body)})

    async with serving(Scripted({"/up": upload}), body_buffer_bytes=64 * 1024) as server:
        client = await Raw.open(server.port)
        client.send(request("POST", "/up", b"z" * (4 << 20)))
        resp = await client.response()
        client.close()
    assert orjson.loads(resp.body) == {"got": 4 << 20}
    assert max(sizes) <= 64 * 1024 + 256 * 1024  # the buffer plus at most one socket read


MAX_BODY = 64 * 1024


async def _capped_upload(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the body as the router does: a 413 as soon as it is over the cap, by its declared
    length before reading any of it, the rest unread."""
    declared = dict(scope["headers"]).get(b"content-length", b"0")
    if int(declared) > MAX_BODY:
        await send_json(send, 413, {"error": "too large"})
        return
    got = 0
    while True:
        message = await receive()
        got += len(message.get("body", b""))
        if got > MAX_BODY:
            await send_json(send, 413, {"error": "too large"})
            return
        if not message.get("more_body"):
            break
    await send_json(send, 200, {"got": got})


@pytest.mark.parametrize("together", [True, False], ids=["pipelined", "after-the-answer"])
async def test_an_answer_before_the_body_was_read_closes_the_connection(together: bool) -> None:
    """A body just over the cap may be buffered whole when the 413 goes out; the next request on
    that connection must get an answer or a close, never silence."""
    oversized = request("POST", "/up", b"z" * (70 * 1024))
    following = request("POST", "/up", b"small")
    async with serving(Scripted({"/up": _capped_upload})) as server:
        client = await Raw.open(server.port)
        try:
            client.send(oversized + following if together else oversized)
            refused = await client.response()
            if not together:
                client.send(following)
            rest = await client.closed(timeout=15)
        finally:
            client.close()
    assert refused.status == 413
    assert refused.headers.get("connection") == "close"
    assert rest == b""  # closed, and nothing said about the request behind it


async def test_a_request_whose_body_the_app_read_whole_keeps_the_connection() -> None:
    async with serving(Scripted({"/up": _capped_upload})) as server:
        client = await Raw.open(server.port)
        try:
            for size in (MAX_BODY, 10):
                client.send(request("POST", "/up", b"z" * size))
                resp = await client.response()
                assert orjson.loads(resp.body) == {"got": size}
                assert resp.headers.get("connection") != "close"
        finally:
            client.close()


async def test_head_gets_the_headers_of_get_and_no_body() -> None:
    async def page(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, b"0123456789", b"text/plain")

    async with serving(Scripted({"/page": page})) as server:
        client = await Raw.open(server.port)
        client.send(request("HEAD", "/page") + request("GET", "/page"))
        head = await client.response(head_request=True)
        get = await client.response()
        client.close()
    assert head.headers["content-length"] == "10"
    assert head.body == b""
    assert get.body == b"0123456789"  # nothing of the HEAD answer's body was left in between


async def test_204_and_304_have_no_body_and_no_chunking() -> None:
    async def status(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        code = int(scope["query_string"])
        await send({"type": "http.response.start", "status": code, "headers": []})
        await send({"type": "http.response.body", "body": b"ignored"})

    async with serving(Scripted({"/s": status})) as server:
        client = await Raw.open(server.port)
        for code in (204, 304):
            client.send(request("GET", f"/s?{code}"))
            resp = await client.response()
            assert resp.status == code
            assert "transfer-encoding" not in resp.headers
        client.send(request("GET", "/next"))
        resp = await client.response()  # still in step: no stray body bytes in between
        assert orjson.loads(resp.body)["path"] == "/next"
        client.close()


async def test_http_10_gets_a_close_delimited_body_and_keep_alive_only_when_asked() -> None:
    async def stream(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part1 ", "more_body": True})
        await send({"type": "http.response.body", "body": b"part2"})

    async with serving(Scripted({"/stream": stream})) as server:
        plain = await Raw.open(server.port)
        plain.send(request("GET", "/stream", version="1.0"))
        resp = await plain.response()
        assert "transfer-encoding" not in resp.headers
        assert resp.body == b"part1 part2"  # ended by the close
        kept = await Raw.open(server.port)
        for path in ("/a", "/b"):
            kept.send(request("GET", path, b"", "Connection: keep-alive", version="1.0"))
            resp = await kept.response()
            assert resp.headers["connection"] == "keep-alive"
            assert orjson.loads(resp.body)["http_version"] == "1.0"
        plain.close()
        kept.close()


async def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    async with serving() as server:
        client = await Raw.open(server.port)
        client.send(b"POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        interim = await client.response()
        assert interim.status == 100
        client.send(b"data")
        resp = await client.response()
        assert orjson.loads(resp.body)["body"] == "data"
        client.close()


async def test_an_upgrade_request_is_answered_as_plain_http_with_its_body() -> None:
    async with serving() as server:
        client = await Raw.open(server.port)
        client.send(
            b"POST /up HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAAQAAP__\r\nContent-Length: 5\r\n\r\nhello" + request("GET", "/next")
        )
        first = await client.response()
        second = await client.response()
        client.close()
    assert first.status == 200
    assert orjson.loads(first.body)["body"] == "hello"
    assert orjson.loads(second.body)["path"] == "/next"


async def test_connect_is_answered_and_the_connection_closed() -> None:
    async with serving() as server:
        client = await Raw.open(server.port)
        client.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n\x16\x03\x01")
        resp = await client.response()
        assert resp.status == 200
        assert orjson.loads(resp.body)["method"] == "CONNECT"
        assert await client.closed() == b""
        client.close()


_POST = b"POST / HTTP/1.1\r\nHost: t\r\n"
_GET = b"GET / HTTP/1.1\r\nHost: t\r\n"
_CHUNKED = b"Transfer-Encoding: chunked\r\n"

SMUGGLING = {
    "content-length and transfer-encoding": _POST + b"Content-Length: 5\r\n" + _CHUNKED + b"\r\n0\r\n\r\n",
    "transfer-encoding and content-length": _POST + _CHUNKED + b"Content-Length: 5\r\n\r\n0\r\n\r\n",
    "two different content-lengths": _POST + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "a content-length list": _POST + b"Content-Length: 3, 3\r\n\r\nabc",
    "a signed content-length": _POST + b"Content-Length: +3\r\n\r\nabc",
    "a bad chunk size": _POST + _CHUNKED + b"\r\nzz\r\nabc\r\n0\r\n\r\n",
    "an overflowing chunk size": _POST + _CHUNKED + b"\r\nfffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
    "chunked not last": _POST + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "an unknown transfer-encoding": _POST + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "space before the colon": _POST + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "obs-fold": _GET + b"X-A: b\r\n c\r\n\r\n",
    "a control character": _GET + b"X-A: b\x01c\r\n\r\n",
    "a NUL": _GET + b"X-A: b\x00c\r\n\r\n",
    "a bare LF": b"GET / HTTP/1.1\nHost: t\n\n",
    "a bare CR": _GET + b"X: y\rZ: w\r\n\r\n",
    "a space in the target": b"GET /a b HTTP/1.1\r\nHost: t\r\n\r\n",
    "a header without a colon": _GET + b"NoColon\r\n\r\n",
    "transfer-encoding on HTTP/1.0": b"POST / HTTP/1.0\r\n" + _CHUNKED + b"\r\n0\r\n\r\n",
    "HTTP/2.0 on an HTTP/1 connection": b"GET / HTTP/2.0\r\nHost: t\r\n\r\n",
}


@pytest.mark.parametrize("shape", list(SMUGGLING))
async def test_malformed_and_smuggling_shapes_get_400_501_or_505_and_a_close(shape: str) -> None:
    calls: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            calls.append(scope["path"])
            await read_all(receive)
            await send_json(send, 200, {})

    async with serving(app) as server:
        client = await Raw.open(server.port)
        client.send(SMUGGLING[shape] + request("GET", "/smuggled"))
        resp = await client.response()
        rest = await client.closed()
        client.close()
    assert resp.status == {"HTTP/2.0 on an HTTP/1 connection": 505, "an unknown transfer-encoding": 501}.get(
        shape, 400
    )
    assert resp.headers["connection"] == "close"
    assert orjson.loads(resp.body)["error"]["type"] == "invalid_request_error"
    assert rest == b""  # nothing after the refusal: the request behind it was never read
    assert "/smuggled" not in calls


async def test_the_version_is_each_requests_own_however_its_line_arrives(monkeypatch: Any) -> None:
    fed = FedBytes().install(monkeypatch)
    kept_10 = "Connection: keep-alive"
    async with serving() as server:
        client = await Raw.open(server.port)
        # Pipelined in one write: the second request's line is in the middle of the read.
        pipelined = request("GET", "/a") + request("GET", "/b", b"", kept_10, version="1.0")
        client.send(pipelined)
        first, second = await client.response(), await client.response()
        # A line that arrives in two reads: the first read ends inside it.
        split = request("GET", "/c", b"", kept_10, version="1.0")
        client.send(split[:14])
        async with asyncio.timeout(10):
            while fed.by_client[client.port] < len(pipelined) + 14:
                await asyncio.sleep(0.01)
        client.send(split[14:])
        third = await client.response()
        # An empty line before the request line.
        client.send(b"\r\n" + request("GET", "/d"))
        fourth = await client.response()
        client.close()

    answers = [orjson.loads(r.body) for r in (first, second, third, fourth)]
    assert [(a["path"], a["http_version"]) for a in answers] == [
        ("/a", "1.1"),
        ("/b", "1.0"),
        ("/c", "1.0"),
        ("/d", "1.1"),
    ]
