"""The certificates `bench overhead --tls` makes: the router serves them and the load client's
context trusts them (a real handshake through the router's HTTP server on loopback)."""

from __future__ import annotations

from pathlib import Path

from router.httpserver import HttpServer, ServerConfig
from router.lab.bench.overhead import wait_up
from router.lab.bench.tlscerts import run_certificates
from router.tls.contexts import server_context
from tests.httpserver.apps import echo


async def test_the_run_certificates_make_a_handshake(tmp_path: Path) -> None:
    certs = run_certificates(tmp_path)
    assert certs.serve_args() == ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    context = server_context(certs.cert, certs.key, None, roles=("cert", "key", "client_ca"))
    server = HttpServer(echo, ServerConfig(graceful_shutdown_s=1.0), ssl=context)
    await server.start("127.0.0.1", 0)
    try:
        await wait_up(f"https://127.0.0.1:{server.port}", b"/health", tls=certs.client)
    finally:
        await server.shutdown()
