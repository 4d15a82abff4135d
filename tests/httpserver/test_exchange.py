"""The app's side of one request: the scope, `receive` and `send` as the ASGI spec has them,
flow control both ways, and what the server does with an app that fails."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, cast

import orjson
import pytest

from router.app.asgi import Receive, Scope, Send, body_writer, send_json
from router.lanes.slowclient import unsent_probe
from tests.httpserver.apps import Scripted, read_all
from tests.httpserver.raw import Raw, ask, request, serving


async def test_the_scope_is_what_the_spec_says() -> None:
    async with serving() as server:
        client = await Raw.open(server.port)
        client.send(request("GET", "/a%20b/%C3%A9?x=1&y=%20", b"", "X-Mixed-Case: Value"))
        seen = orjson.loads((await client.response()).body)
        port = client.port
        client.close()
    assert seen["type"] == "http"
    assert seen["asgi"] == {"version": "3.0", "spec_version": "2.3"}
    assert seen["http_version"] == "1.1"
    assert seen["method"] == "GET"
    assert seen["scheme"] == "http"
    assert seen["path"] == "/a b/é"
    assert seen["raw_path"] == "/a%20b/%C3%A9"
    assert seen["query_string"] == "x=1&y=%20"
    assert seen["root_path"] == ""
    assert ["x-mixed-case", "Value"] in seen["headers"]
    assert seen["client"] == ["127.0.0.1", port]
    assert seen["server"] == ["127.0.0.1", server.port]


async def test_receive_gives_disconnect_after_the_response_and_when_the_client_leaves() -> None:
    async def after(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        await send_json(send, 200, {})
        app.note("after response", (await receive())["type"])

    async def waits(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        app.note("waiting")
        app.note("left", (await receive())["type"])
        await send_json(send, 200, {})  # nobody to send to: not an error
        app.note("sent")

    app = Scripted({"/after": after, "/waits": waits})
    async with serving(app) as server:
        client = await Raw.open(server.port)
        client.send(request("GET", "/after"))
        await client.response()
        assert await app.wait_for("after response") == "http.disconnect"
        client.send(request("GET", "/waits"))
        await app.wait_for("waiting")
        client.close()
        assert await app.wait_for("left") == "http.disconnect"
        await app.wait_for("sent")


async def test_the_body_writer_tells_of_a_client_that_leaves_once_and_not_after_release() -> None:
    async def told(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        writer = body_writer(scope)
        assert writer is not None
        app.note("task named", writer.request_task() is asyncio.current_task())
        assert writer.on_disconnect(lambda: app.note("told"))
        app.note("waiting")
        await app.wait_for("told")
        # After its connection is gone: a second callback is called soon, never lost.
        writer.on_disconnect(lambda: app.note("told late"))
        await app.wait_for("told late")
        app.note("done")

    async def answered(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        writer = body_writer(scope)
        assert writer is not None
        writer.on_disconnect(lambda: app.note("told after answering"))
        await send_json(send, 200, {})

    app = Scripted({"/told": told, "/answered": answered})
    async with serving(app) as server:
        client = await Raw.open(server.port)
        client.send(request("GET", "/told"))
        await app.wait_for("waiting")
        client.close()
        await app.wait_for("done")
        assert await app.wait_for("task named")
        assert [e for e, _ in app.events].count("told") == 1
        # The app returned, its exchange released: a connection lost later calls nothing.
        client = await Raw.open(server.port)
        for _ in range(2):
            client.send(request("GET", "/answered"))
            await client.response()
        client.close()
        async with asyncio.timeout(10):
            while server.open_connections:
                await asyncio.sleep(0.01)
    assert "told after answering" not in [e for e, _ in app.events]


async def test_messages_out_of_order_are_errors() -> None:
    async def misuse(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": []}
        for message in (
            {"type": "http.response.body", "body": b"early"},
            start,
            start,
            {"type": "http.response.trailers"},
            {"type": "http.response.body", "body": b"end"},
            {"type": "http.response.body", "body": b"late"},
        ):
            try:
                await send(message)
            except RuntimeError as err:
                app.note("refused", str(err))

    app = Scripted({"/misuse": misuse})
    async with serving(app) as server:
        resp = await ask(server.port, request("GET", "/misuse"))
    refused = [detail for name, detail in app.events if name == "refused"]
    assert len(refused) == 4
    assert "before http.response.start" in refused[0]
    assert "twice" in refused[1]
    assert "http.response.trailers" in refused[2]
    assert "after the response was complete" in refused[3]
    assert resp.body == b"end"


async def test_a_body_send_returns_without_suspending_until_the_transport_pauses() -> None:
    """`send` awaits only while the transport has paused writing: a client that stops reading
    makes a send suspend, and reading again lets it go on. Meanwhile the bytes it has not received
    are told, and bounded by the bytes written."""

    async def flood(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        probe = unsent_probe(send)
        writer = body_writer(scope)
        assert writer is not None
        app.note("probe", probe is not None)
        chunk = {"type": "http.response.body", "body": b"x" * 65536, "more_body": True}
        sent = 0
        while True:
            step = cast(Coroutine[Any, Any, None], send(chunk))
            try:
                waiting = step.send(None)
            except StopIteration:
                sent += 1
                continue
            bound_before = writer.unsent_at_most()
            app.note("suspended", (sent, probe() if probe else 0, writer.unsent()))
            bound_after = writer.unsent_at_most()
            writer.write_body(b"y" * 10, False)  # framed: "a" CRLF, the ten bytes, CRLF
            app.note("bounds", (bound_before, bound_after, writer.unsent_at_most()))
            await asyncio.wait([waiting])  # what `send` waits on: the transport taking writes again
            with contextlib.suppress(StopIteration):
                step.send(None)
            break
        await send({"type": "http.response.body", "body": b""})

    app = Scripted({"/flood": flood})
    async with serving(app) as server:
        client = await Raw.open(server.port)
        client.send(request("GET", "/flood"))
        assert await app.wait_for("probe") is True
        sent, unsent, told = await app.wait_for("suspended")
        bound_before, bound_after, bound_later = await app.wait_for("bounds")
        resp = await client.response()
        client.close()
    assert sent >= 1
    assert unsent > 0  # the lag router/lanes/slowclient.py measures through `send`
    # The server's body writer tells the same, read in the same loop step with the client not
    # reading: its kernel send queue, not only the transport's buffer.
    assert told == unsent
    # Its bound without a system call: every byte written (the head and each framed chunk)
    # before the kernel was asked, what the kernel told after, and that plus each byte since.
    assert bound_before >= (sent + 1) * (65536 + len(b"10000\r\n\r\n")) > told
    assert bound_after == told
    assert bound_later == told + len(b"a\r\n" + b"y" * 10 + b"\r\n")
    assert len(resp.body) == (sent + 1) * 65536 + 10  # the suspended send went out too


async def test_an_app_that_does_not_read_its_body_pauses_reading() -> None:
    release: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def late(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await release
        body, sizes = await read_all(receive)
        await send_json(send, 200, {"got": len(body), "first": sizes[0]})

    async with serving(Scripted({"/late": late}), body_buffer_bytes=64 * 1024) as server:
        client = await Raw.open(server.port)
        client.send(request("POST", "/late", b"b" * (16 << 20)))
        with pytest.raises(TimeoutError):  # 16 MB never leave: kernel buffers hold far less
            async with asyncio.timeout(1.0):
                await client.writer.drain()
        release.set_result(None)
        resp = orjson.loads((await client.response()).body)
        client.close()
    assert resp["got"] == 16 << 20
    assert resp["first"] <= 64 * 1024 + 256 * 1024  # held: the buffer plus one socket read


async def test_an_app_error_before_the_response_is_a_500_logged_once(caplog: Any) -> None:
    async def broken(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        raise ValueError("boom")

    async with serving(Scripted({"/broken": broken})) as server:
        client = await Raw.open(server.port)
        with caplog.at_level(logging.ERROR, logger="lane_router.http"):
            client.send(request("GET", "/broken"))
            resp = await client.response()
        assert await client.closed() == b""
        client.close()
    assert resp.status == 500
    assert orjson.loads(resp.body) == {
        "error": {"message": "internal router error", "type": "server_error", "code": "internal_error"}
    }
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].exc_info is not None and "GET /broken" in errors[0].getMessage()


class Quiet(Exception):
    pass


@pytest.mark.parametrize("error", [RuntimeError, Quiet])
async def test_an_app_error_after_the_response_started_drops_the_connection(
    error: type[Exception], caplog: Any
) -> None:
    async def half(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise error("cut")

    async with serving(Scripted({"/half": half}), quiet_errors=(Quiet,)) as server:
        client = await Raw.open(server.port)
        with caplog.at_level(logging.ERROR, logger="lane_router.http"):
            client.send(request("GET", "/half"))
            received = await client.closed()
        client.close()
    assert b"7\r\npartial\r\n" in received
    assert not received.endswith(b"0\r\n\r\n")  # never terminated: the client sees a cut body
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == (0 if error is Quiet else 1)


async def test_an_app_that_returns_without_answering_gets_a_500() -> None:
    async def silent(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        return

    async with serving(Scripted({"/silent": silent})) as server:
        assert (await ask(server.port, request("GET", "/silent"))).status == 500


async def test_a_response_head_with_an_injected_line_is_a_500_and_none_of_it_is_sent() -> None:
    async def inject(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"x-request-id", b"1\r\nset-cookie: session=stolen")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

    async with serving(Scripted({"/inject": inject})) as server:
        resp = await ask(server.port, request("GET", "/inject"))
    assert resp.status == 500
    assert b"stolen" not in resp.head + resp.body


async def test_a_whole_response_through_the_body_writer_is_what_start_and_body_would_send() -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]

    async def by_messages(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    async def whole(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        writer = body_writer(scope)
        assert writer is not None
        writer.respond(201, headers, b"{}")
        app.note("after response", (await receive())["type"])

    app = Scripted({"/messages": by_messages, "/whole": whole})
    async with serving(app) as server:
        client = await Raw.open(server.port)
        client.send(request("GET", "/messages"))
        sent = await client.response()
        client.send(request("GET", "/whole"))  # on the same kept-alive connection
        answered = await client.response()
        assert await app.wait_for("after response") == "http.disconnect"
        client.close()
    assert (answered.status, answered.body) == (sent.status, sent.body) == (201, b"{}")
    undated = [{k: v for k, v in r.headers.items() if k != "date"} for r in (answered, sent)]
    assert undated[0] == undated[1]
    assert "date" in answered.headers


@pytest.mark.parametrize(
    ("request_head", "framing"),
    [
        (request("GET", "/framed"), b"A\r\n0123456789\r\n0\r\n\r\n"),
        (request("GET", "/framed", version="1.0"), b""),
    ],
    ids=["chunked", "until-close"],
)
async def test_chunks_framed_by_the_caller_go_out_as_they_are_only_on_a_chunked_response(
    request_head: bytes, framing: bytes
) -> None:
    async def framed(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        writer = body_writer(scope)
        assert writer is not None
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        writer.write_chunks(b"A\r\n0123456789\r\n", b"0123456789")
        writer.write_body(b"", True)

    async with serving(Scripted({"/framed": framed})) as server:
        client = await Raw.open(server.port)
        client.send(request_head)
        resp = await client.response()
        client.close()
    assert (resp.status, resp.body, resp.framing) == (200, b"0123456789", framing)


async def test_a_whole_response_with_an_injected_line_is_a_500_and_none_of_it_is_sent() -> None:
    async def inject(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        writer = body_writer(scope)
        assert writer is not None
        writer.respond(200, [(b"x-request-id", b"1\r\nset-cookie: session=stolen")], b"{}")

    async with serving(Scripted({"/inject": inject})) as server:
        resp = await ask(server.port, request("GET", "/inject"))
    assert resp.status == 500
    assert b"stolen" not in resp.head + resp.body
