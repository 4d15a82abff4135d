"""The server as a whole: the graceful stop, the lifespan around serving, a listener given as a
bound socket, and TLS through the `ssl` context it is handed."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.app.asgi import Receive, Scope, Send, send_json
from router.httpserver import HttpServer, ServerConfig, StartupFailed
from tests.httpserver.apps import Scripted, echo, event, read_all, sse_start
from tests.httpserver.raw import Raw, ask, request, serving

SHUTDOWN_EVENT = b'data: {"error": {"code": "server_shutdown"}}\n\n'


async def _stream_forever(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
    await read_all(receive)
    await send(sse_start())
    await send(event(0))
    app.note("streaming")
    await asyncio.get_running_loop().create_future()  # until cancelled


async def test_the_stop_cuts_an_open_stream_with_the_shutdown_event_and_no_traceback(caplog: Any) -> None:
    app = Scripted({"/stream": _stream_forever})
    server = HttpServer(app, ServerConfig(graceful_shutdown_s=0.3, shutdown_event=SHUTDOWN_EVENT))
    await server.start()
    client = await Raw.open(server.port)
    client.send(request("GET", "/stream"))
    head = await client.reader.readuntil(b"\r\n\r\n")
    await app.wait_for("streaming")
    with caplog.at_level(logging.DEBUG):
        await server.shutdown()
    rest = await client.closed()
    client.close()

    assert b"transfer-encoding: chunked" in head
    first = b'data: {"i":0}\n\n'
    assert rest == b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (
        len(first),
        first,
        len(SHUTDOWN_EVENT),
        SHUTDOWN_EVENT,
    )
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_the_stop_lets_requests_in_progress_finish_and_closes_idle_connections() -> None:
    release: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def slow(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        app.note("started")
        await release
        await send_json(send, 200, {"finished": True})

    app = Scripted({"/slow": slow})
    server = HttpServer(app, ServerConfig(graceful_shutdown_s=10))
    await server.start()
    idle = await Raw.open(server.port)
    idle.send(request("GET", "/"))
    await idle.response()
    busy = await Raw.open(server.port)
    busy.send(request("GET", "/slow"))
    await app.wait_for("started")
    stopping = asyncio.create_task(server.shutdown())
    assert await idle.closed() == b""  # closed at once, while the other request goes on
    with pytest.raises(OSError):
        await Raw.open(server.port)  # no longer accepting
    assert not stopping.done()
    release.set_result(None)
    resp = await busy.response()
    assert resp.headers["connection"] == "close"
    assert orjson.loads(resp.body) == {"finished": True}
    await asyncio.wait_for(stopping, 5)
    idle.close()
    busy.close()


async def test_a_request_still_running_at_the_deadline_without_a_stream_is_closed(caplog: Any) -> None:
    async def hang(app: Scripted, scope: Scope, receive: Receive, send: Send) -> None:
        app.note("started")
        await asyncio.get_running_loop().create_future()

    app = Scripted({"/hang": hang})
    server = HttpServer(app, ServerConfig(graceful_shutdown_s=0.2, shutdown_event=SHUTDOWN_EVENT))
    await server.start()
    client = await Raw.open(server.port)
    client.send(request("POST", "/hang", b"{}"))
    await app.wait_for("started")
    with caplog.at_level(logging.DEBUG):
        await server.shutdown()
    assert await client.closed() == b""
    client.close()
    assert not [r for r in caplog.records if r.exc_info]


async def test_the_lifespan_runs_around_serving_and_a_failed_startup_stops_the_start() -> None:
    events: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            events.append("startup")
            await send({"type": "lifespan.startup.complete"})
            await receive()
            events.append("shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return
        events.append("request")
        await send_json(send, 200, {})

    server = HttpServer(app)
    await server.start()
    client = await Raw.open(server.port)
    client.send(request("GET", "/"))
    await client.response()
    client.close()
    await server.shutdown()
    assert events == ["startup", "request", "shutdown"]

    async def refuses(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no backends configured"})

    failing = HttpServer(refuses)
    with pytest.raises(StartupFailed, match="no backends configured"):
        await failing.start()
    assert failing.sockets == ()


async def test_an_app_without_a_lifespan_is_served() -> None:
    async def plain(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"unsupported scope {scope['type']}")
        await send_json(send, 200, {"ok": True})

    async with serving(plain) as server:
        assert (await ask(server.port, request("GET", "/"))).status == 200


async def test_a_bound_socket_can_be_served() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = HttpServer(echo)
    await server.start(sock=sock)
    try:
        assert server.port == port
        resp = await ask(port, request("GET", "/via-socket"))
        assert orjson.loads(resp.body)["path"] == "/via-socket"
    finally:
        await server.shutdown()


def _certificate(directory: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_tls_is_terminated_with_the_context_given(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    client_side = ssl.create_default_context(cafile=str(cert))
    server = HttpServer(echo, ssl=server_side)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_side)
        client = Raw(reader, writer)
        client.send(request("GET", "/secure"))
        seen = orjson.loads((await client.response()).body)
        client.close()
    finally:
        await server.shutdown()
    assert seen["scheme"] == "https"
    assert seen["path"] == "/secure"
