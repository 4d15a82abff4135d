"""The router in front of https backends: fake backends on uvicorn over TLS on loopback, the
router on its own server, a client on plain HTTP. With the pool's CA and name the requests and
the health probes succeed; the wrong CA or name fails closed — 502, the backend sees nothing,
the upstream error metric counts the reason — and a backend that requires a client
certificate gets the pool's."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from router.config.load import parse_profile
from router.fleet.backend import Health
from router.server import build_state
from router.settings import Settings
from router.state.live import RouterState
from tests.support.fakebackend import FakeBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import server_group
from tests.support.tlscerts import Issued, TestCA

WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class HttpsStack:
    url: str
    backend: FakeBackend
    state: RouterState

    def backend_health(self) -> Health:
        return self.state.runtime.pools["interactive"].backends[0].health

    async def until_health(self, wanted: Health) -> None:
        async with asyncio.timeout(10):
            while self.backend_health() is not wanted:
                await asyncio.sleep(0.02)

    def errors(self, reason: str) -> float:
        for family in self.state.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == "lane_router_upstream_errors_total" and sample.labels["reason"] == reason:
                    return sample.value
        return 0.0


@asynccontextmanager
async def https_stack(
    leaf: Issued, tls: dict[str, Any], client_ca: Path | None = None, **health: Any
) -> AsyncIterator[HttpsStack]:
    backend = FakeBackend()
    options: dict[str, Any] = {"ssl_certfile": str(leaf.cert), "ssl_keyfile": str(leaf.key)}
    if client_ca is not None:
        options.update(ssl_ca_certs=str(client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    async with server_group() as group:
        url = await group.start(backend, **options)
        data = profile(["https://" + url.removeprefix("http://")])
        data["pools"]["interactive"]["tls"] = tls
        data["health"].update(health)
        state = build_state(parse_profile(data), None)
        yield HttpsStack(await group.serve_router(state, Settings()), backend, state)


async def _chat(stack: HttpsStack) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
        return await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))


async def test_requests_and_health_probes_reach_a_verified_https_backend(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    async with https_stack(ca.issue("127.0.0.1"), {"ca_file": str(ca.ca_file)}) as stack:
        await stack.until_health(Health.UP)  # the probe spoke TLS with the pool's CA
        answer = await _chat(stack)
        assert answer.status_code == 200
        assert answer.json()["usage"]["completion_tokens"] == 16  # the fake backend's default
    assert [s.path for s in stack.backend.seen] == ["/v1/chat/completions"]


# Probes far apart and a high failure count: the backend stays in rotation, so each request
# meets the handshake itself.
PATIENT = {"interval_s": 60, "unhealthy_after": 100}


async def _fails_closed(stack: HttpsStack, reason: str) -> None:
    for _ in range(2):
        answer = await _chat(stack)
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == reason
        assert "127.0.0.1" not in answer.text
    assert stack.backend.seen == []
    assert stack.errors(reason) >= 2


async def test_a_backend_signed_by_another_ca_fails_closed(tmp_path: Path) -> None:
    ca, stranger = TestCA(tmp_path), TestCA(tmp_path, "stranger")
    async with https_stack(stranger.issue("127.0.0.1"), {"ca_file": str(ca.ca_file)}, **PATIENT) as stack:
        await _fails_closed(stack, "upstream_tls_untrusted")
        assert stack.backend_health() is not Health.UP  # its probes fail too


async def test_a_backend_whose_certificate_names_another_host_fails_closed(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    async with https_stack(ca.issue("vllm.internal"), {"ca_file": str(ca.ca_file)}, **PATIENT) as stack:
        await _fails_closed(stack, "upstream_tls_name_mismatch")


async def test_server_name_verifies_an_ip_addressed_backend_by_its_name(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    tls = {"ca_file": str(ca.ca_file), "server_name": "vllm.internal"}
    async with https_stack(ca.issue("vllm.internal"), tls) as stack:
        await stack.until_health(Health.UP)
        assert (await _chat(stack)).status_code == 200


async def test_a_backend_requiring_a_client_certificate_gets_the_pools(tmp_path: Path) -> None:
    ca, routers = TestCA(tmp_path), TestCA(tmp_path, "routers")
    mine = routers.issue("router")
    tls = {"ca_file": str(ca.ca_file), "client_cert_file": str(mine.cert), "client_key_file": str(mine.key)}
    async with https_stack(ca.issue("127.0.0.1"), tls, client_ca=routers.ca_file) as stack:
        await stack.until_health(Health.UP)
        assert (await _chat(stack)).status_code == 200
    assert len(stack.backend.seen) == 1


async def test_without_the_client_certificate_such_a_backend_sees_nothing(tmp_path: Path) -> None:
    ca, routers = TestCA(tmp_path), TestCA(tmp_path, "routers")
    tls = {"ca_file": str(ca.ca_file)}
    async with https_stack(ca.issue("127.0.0.1"), tls, client_ca=routers.ca_file, **PATIENT) as stack:
        answer = await _chat(stack)
        assert answer.status_code == 502
        # TLS 1.3: the backend's refusal may come after the client's side of the handshake.
        assert answer.json()["error"]["code"] in ("upstream_tls_refused", "upstream_closed")
        assert stack.backend_health() is not Health.UP
    assert stack.backend.seen == []
