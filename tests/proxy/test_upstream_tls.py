"""The upstream client to https backends: a fake backend on uvicorn over TLS on loopback, with
the right CA, the wrong one, the wrong name, and a client certificate it requires. A handshake
that fails is an UpstreamTlsError raised before any request byte was written."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from router.errors import UpstreamClosed, UpstreamConnectError
from router.proxy.upstream import UpstreamPool
from router.tls.contexts import client_context
from router.tls.upstream import UpstreamTlsError
from tests.support.fakebackend import FakeBackend
from tests.support.servers import server_group
from tests.support.tlscerts import Issued, TestCA


async def _https(backend: FakeBackend, group: Any, leaf: Issued, client_ca: Path | None = None) -> str:
    options: dict[str, Any] = {"ssl_certfile": str(leaf.cert), "ssl_keyfile": str(leaf.key)}
    if client_ca is not None:
        options.update(ssl_ca_certs=str(client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    url = await group.start(backend, **options)
    return "https://" + url.removeprefix("http://")


BODY = b'{"model": "fake-model", "prompt": "hi", "max_tokens": 2}'


async def _complete(pool: UpstreamPool) -> int:
    response = await pool.request(b"POST", b"/v1/completions", [(b"content-type", b"application/json")], BODY)
    await response.read()
    return response.status


async def test_a_backend_verified_with_the_pools_ca_answers(tmp_path: Path) -> None:
    ca, backend = TestCA(tmp_path), FakeBackend()
    async with server_group() as group:
        origin = await _https(backend, group, ca.issue("127.0.0.1"))
        async with UpstreamPool(origin, ssl_context=client_context(ca.ca_file)) as pool:
            assert await _complete(pool) == 200
            assert await _complete(pool) == 200
            assert pool.stats().open == 1  # kept alive over TLS
    assert [s.path for s in backend.seen] == ["/v1/completions", "/v1/completions"]


async def test_a_backend_signed_by_another_ca_gets_nothing(tmp_path: Path) -> None:
    ca, stranger, backend = TestCA(tmp_path), TestCA(tmp_path, "stranger"), FakeBackend()
    async with server_group() as group:
        origin = await _https(backend, group, stranger.issue("127.0.0.1"))
        async with UpstreamPool(origin, ssl_context=client_context(ca.ca_file), label="backend 0") as pool:
            with pytest.raises(UpstreamTlsError) as err:
                await pool.request(b"POST", b"/v1/completions", [], b"{}")
    assert err.value.code == "upstream_tls_untrusted"
    assert isinstance(err.value, UpstreamConnectError) and err.value.retryable  # never written
    assert "127.0.0.1" not in err.value.message
    assert backend.seen == []


async def test_a_certificate_for_another_name_is_refused_unless_the_pool_names_it(tmp_path: Path) -> None:
    ca, backend = TestCA(tmp_path), FakeBackend()
    async with server_group() as group:
        origin = await _https(backend, group, ca.issue("vllm.internal"))
        context = client_context(ca.ca_file)
        async with UpstreamPool(origin, ssl_context=context) as pool:
            with pytest.raises(UpstreamTlsError) as err:
                await _complete(pool)
        assert err.value.code == "upstream_tls_name_mismatch"
        assert backend.seen == []
        async with UpstreamPool(origin, ssl_context=context, server_hostname="vllm.internal") as pool:
            assert await _complete(pool) == 200


async def test_a_backend_that_requires_a_client_certificate(tmp_path: Path) -> None:
    ca, routers, backend = TestCA(tmp_path), TestCA(tmp_path, "routers"), FakeBackend()
    async with server_group() as group:
        origin = await _https(backend, group, ca.issue("127.0.0.1"), client_ca=routers.ca_file)
        without = client_context(ca.ca_file)
        async with UpstreamPool(origin, ssl_context=without) as pool:
            # TLS 1.3 completes the client's side of the handshake before the backend checks
            # the certificate; its refusal then ends the connection before any answer.
            with pytest.raises((UpstreamTlsError, UpstreamClosed)):
                await _complete(pool)
        assert backend.seen == []
        mine = routers.issue("router")
        with_cert = client_context(ca.ca_file, mine.cert, mine.key)
        async with UpstreamPool(origin, ssl_context=with_cert) as pool:
            assert await _complete(pool) == 200
    assert [s.path for s in backend.seen] == ["/v1/completions"]


async def test_a_plain_http_server_on_an_https_origin_fails_the_handshake(tmp_path: Path) -> None:
    ca, backend = TestCA(tmp_path), FakeBackend()
    async with server_group() as group:
        plain = await group.start(backend)
        origin = "https://" + plain.removeprefix("http://")
        async with UpstreamPool(origin, ssl_context=client_context(ca.ca_file)) as pool:
            with pytest.raises(UpstreamTlsError) as err:
                await _complete(pool)
    assert err.value.code == "upstream_tls_failed"
    assert backend.seen == []
