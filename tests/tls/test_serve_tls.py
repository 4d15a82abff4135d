"""`lane-router serve` with TLS on its listener, as a process of its own on loopback (under
uvloop, as deployed): the `openai` SDK over https, plain HTTP and silent clients on the TLS port,
client certificates required, the certificate swapped by SIGHUP (or kept when the new one is
unusable), `--workers 2` serving TLS from every worker, and the memory thousands of TLS
connections leave behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fakebackend import Behaviour, FakeBackend
from tests.support.processes import stop
from tests.support.profiles import KEYS, MODEL, auth, profile
from tests.support.scaleout import write_profile
from tests.support.servers import free_port, server_group
from tests.support.tlscerts import Issued, TestCA, serial_of

START_TIMEOUT_S = 60.0


@dataclass
class TlsRouter:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    ca: TestCA
    cert: Path  # the paths the router reads; a test replaces their contents
    key: Path

    def client(self, cert: Issued | None = None) -> httpx.AsyncClient:
        limits = httpx.Limits(max_keepalive_connections=0)  # a new handshake per request
        return httpx.AsyncClient(
            base_url=self.url, verify=self.ca.client_context(cert), timeout=30, limits=limits
        )

    async def serial(self) -> str:
        """The serial of the certificate a new connection is served."""
        _, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.ca.client_context())
        try:
            return str(writer.get_extra_info("ssl_object").getpeercert()["serialNumber"])
        finally:
            writer.close()

    async def served_by(self) -> tuple[int, str]:
        """On a new connection: the worker that serves it (its /admin/lanes report says), and the
        serial of the certificate it was served."""
        context = self.ca.client_context()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=context)
        try:
            serial = str(writer.get_extra_info("ssl_object").getpeercert()["serialNumber"])
            token = auth("ops")["authorization"]
            writer.write(b"GET /admin/lanes HTTP/1.1\r\nHost: r\r\nAuthorization: %b\r\n" % token.encode())
            writer.write(b"Connection: close\r\n\r\n")
            answer = await reader.read()
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), answer[:300]
        return int(json.loads(body)["worker"]), serial

    def rss_kb(self) -> int:
        """The router process's resident memory (its VmRSS)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc status")

    async def counter(self, name: str, **labels: str) -> float:
        async with self.client() as http:
            text = (await http.get("/metrics", headers=auth("scraper"))).text
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    async def until_counter(self, name: str, at_least: float, **labels: str) -> None:
        async with asyncio.timeout(30):
            while await self.counter(name, **labels) < at_least:
                await asyncio.sleep(0.05)

    async def until_every_worker_ready(self, workers: int) -> None:
        """Until each worker counts its backend up (and so has its signal handlers in place)."""
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                ups = set()
                for worker in range(workers):
                    if await self.counter("lane_router_backend_up", worker=str(worker)) >= 1:
                        ups.add(worker)
                if len(ups) == workers:
                    return
                await asyncio.sleep(0.1)


def install(leaf: Issued, cert: Path, key: Path) -> None:
    """Put `leaf` where the router reads its certificate, as a renewal would."""
    shutil.copyfile(leaf.cert, cert)
    shutil.copyfile(leaf.key, key)


@contextlib.asynccontextmanager
async def tls_router(
    tmp_path: Path,
    backend_url: str,
    *extra: str,
    workers: int | None = None,
    client_cert: Issued | None = None,
    **env: str,
) -> AsyncIterator[TlsRouter]:
    ca = TestCA(tmp_path)
    cert, key = tmp_path / "served-cert.pem", tmp_path / "served-key.pem"
    install(ca.issue("127.0.0.1", "localhost"), cert, key)
    config = write_profile(tmp_path / "p.yaml", profile([backend_url]))
    port = free_port()
    argv = [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", str(port)]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key), *extra]
    if workers is not None:
        argv += ["--workers", str(workers)]
    log = tmp_path / "router.log"
    proc = _spawn(argv, {**os.environ, "LANE_ROUTER_GRACEFUL_SHUTDOWN_S": "5", **env}, log)
    router = TlsRouter(f"https://127.0.0.1:{port}", port, proc, log, ca, cert, key)
    try:
        await _ready(router, client_cert)
        yield router
    finally:
        await asyncio.to_thread(stop, proc, 20.0)


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


async def _ready(router: TlsRouter, cert: Issued | None) -> None:
    async with router.client(cert) as http, asyncio.timeout(START_TIMEOUT_S):
        while True:
            assert router.proc.poll() is None, router.log.read_text()
            with contextlib.suppress(httpx.TransportError):
                if (await http.get("/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.05)


@pytest.fixture
async def backend_url() -> AsyncIterator[str]:
    backend = FakeBackend(behaviour=Behaviour(tokens=5, itl_s=0.005))
    async with server_group() as group:
        yield await group.start(backend)


async def test_the_openai_sdk_streams_over_https(tmp_path: Path, backend_url: str) -> None:
    async with tls_router(tmp_path, backend_url) as router:
        http = httpx.AsyncClient(verify=router.ca.client_context())
        sdk = openai.AsyncOpenAI(
            base_url=router.url + "/v1", api_key=KEYS["user"], http_client=http, max_retries=0
        )
        async with sdk:
            stream = await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=5
            )
            pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    assert "".join(p or "" for p in pieces) == " t0 t1 t2 t3 t4"


async def test_plain_http_and_silent_clients_on_the_tls_port_are_closed(
    tmp_path: Path, backend_url: str
) -> None:
    async with tls_router(tmp_path, backend_url, LANE_ROUTER_HEAD_TIMEOUT_S="0.5") as router:
        silent = await asyncio.open_connection("127.0.0.1", router.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        writer.write(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(10):
            assert await reader.read() == b""
            assert await silent[0].read() == b""  # at the head deadline
        writer.close()
        silent[1].close()
        async with router.client() as http:
            assert (await http.get("/ready")).status_code == 200  # the server did not stall
        await router.until_counter("lane_router_tls_handshake_failures_total", 1, reason="plain_http")
        await router.until_counter("lane_router_tls_handshake_failures_total", 1, reason="handshake_timeout")
    log = router.log.read_text()
    assert log.count("TLS handshake failed: plain http") == 1


async def test_client_certificates_are_required_with_a_client_ca(tmp_path: Path, backend_url: str) -> None:
    clients = TestCA(tmp_path, "clients")
    permitted = clients.issue("client-a")
    stranger = TestCA(tmp_path, "stranger").issue("client-b")
    extra = ("--tls-client-ca", str(clients.ca_file))
    async with tls_router(tmp_path, backend_url, *extra, client_cert=permitted) as router:
        for cert in (None, stranger):
            async with router.client(cert) as http:
                with pytest.raises(httpx.TransportError):
                    await http.get("/ready")
        async with router.client(permitted) as http:
            answer = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                headers=auth("user"),
            )
        assert answer.status_code == 200


async def test_sighup_swaps_the_certificate_and_keeps_it_when_the_new_one_is_unusable(
    tmp_path: Path, backend_url: str
) -> None:
    async with tls_router(tmp_path, backend_url) as router:
        renewed = router.ca.issue("127.0.0.1")
        install(renewed, router.cert, router.key)
        os.kill(router.proc.pid, signal.SIGHUP)
        await router.until_counter("lane_router_tls_certificate_reloads_total", 1, result="ok")
        assert await router.serial() == serial_of(renewed)

        router.cert.write_text("not a certificate\n")
        os.kill(router.proc.pid, signal.SIGHUP)
        await router.until_counter("lane_router_tls_certificate_reloads_total", 1, result="refused")
        assert await router.serial() == serial_of(renewed)  # still served
    assert "TLS reload refused, the previous certificate keeps serving: --tls-cert" in router.log.read_text()


@pytest.mark.parametrize("sockets", ["reuseport", "inherit"])
async def test_every_worker_serves_tls_and_reloads_its_certificate(
    tmp_path: Path, backend_url: str, sockets: str
) -> None:
    async with tls_router(tmp_path, backend_url, workers=2, LANE_ROUTER_WORKER_SOCKETS=sockets) as router:
        await router.until_every_worker_ready(2)
        renewed = router.ca.issue("127.0.0.1")
        install(renewed, router.cert, router.key)
        os.kill(router.proc.pid, signal.SIGHUP)  # the parent forwards it to each worker
        await router.until_counter("lane_router_tls_certificate_reloads_total", 2, result="ok")
        serials = {await router.serial() for _ in range(8)}
        async with router.client() as http:
            statuses = [(await http.get("/ready")).status_code for _ in range(8)]
    assert serials == {serial_of(renewed)}
    assert statuses == [200] * 8


async def test_an_admin_reload_swaps_the_certificate_as_sighup_does(tmp_path: Path, backend_url: str) -> None:
    async with tls_router(tmp_path, backend_url) as router:
        renewed = router.ca.issue("127.0.0.1")
        install(renewed, router.cert, router.key)
        async with router.client() as http:
            answer = await http.post("/admin/reload", headers=auth("ops"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["tls"] == "reloaded"
        assert await router.serial() == serial_of(renewed)

        router.cert.write_text("not a certificate\n")
        async with router.client() as http:
            refused = await http.post("/admin/reload", headers=auth("ops"))
        assert await router.serial() == serial_of(renewed)  # still served
    assert refused.status_code == 422
    body = refused.json()
    assert body["error"]["code"] == "invalid_config" and body["tls"] == "refused"
    assert body["error"]["message"].startswith("--tls-cert: ")


@pytest.mark.parametrize("sockets", ["reuseport", "inherit"])
async def test_an_admin_reload_gives_every_worker_the_new_certificate_before_it_is_answered(
    tmp_path: Path, backend_url: str, sockets: str
) -> None:
    async with tls_router(tmp_path, backend_url, workers=2, LANE_ROUTER_WORKER_SOCKETS=sockets) as router:
        await router.until_every_worker_ready(2)
        renewed = router.ca.issue("127.0.0.1")
        install(renewed, router.cert, router.key)
        async with router.client() as http:
            answer = await http.post("/admin/reload", headers=auth("ops"))
        assert answer.status_code == 200, answer.text
        said = [(w["worker"], w["result"], w["tls"]) for w in answer.json()["workers"]]
        assert said == [(0, "reloaded", "reloaded"), (1, "reloaded", "reloaded")]
        # New connections until both workers have served some (the kernel, or whichever worker
        # accepts first, decides which): every handshake since the answer shows the new one.
        served: dict[int, set[str]] = {0: set(), 1: set()}
        for _ in range(200):
            worker, serial = await router.served_by()
            served[worker].add(serial)
            if all(served.values()):
                break
    assert served == {0: {serial_of(renewed)}, 1: {serial_of(renewed)}}


async def _served(router: TlsRouter, request: bool) -> bool:
    """A connection whose handshake completes (then, if `request`, a GET /health on it), closed
    by the client; whether it was served. A busy router may still close one at its deadline."""
    context = router.ca.client_context()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port, ssl=context)
    except (OSError, ssl.SSLError):
        return False
    try:
        if request:
            writer.write(b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n")
            return (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        return True
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


async def _half_open(router: TlsRouter) -> None:
    """A handshake that sends its ClientHello and nothing more, until the router closes it at
    its head deadline."""
    hello = ssl.MemoryBIO()
    client = router.ca.client_context().wrap_bio(ssl.MemoryBIO(), hello, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(hello.read())
        async with asyncio.timeout(30):
            with contextlib.suppress(ConnectionError):  # closed, or reset: ended either way
                while await reader.read(65536):
                    pass
    finally:
        writer.close()


async def _batch(router: TlsRouter, size: int) -> int:
    """`size` connections at once: of every five, three handshakes closed by the client (one
    after a request), two left half-open for the deadline; the handshakes that completed."""
    kinds = [i % 5 for i in range(size)]
    done = await asyncio.gather(
        *(_served(router, kind == 0) if kind < 3 else _half_open(router) for kind in kinds)
    )
    return sum(1 for ok in done if ok is True)


@pytest.mark.timeout(400)
async def test_thousands_of_tls_connections_leave_the_routers_memory_where_it_was(
    tmp_path: Path, backend_url: str
) -> None:
    # A short head deadline cuts the half-open handshakes quickly.
    async with tls_router(tmp_path, backend_url, LANE_ROUTER_HEAD_TIMEOUT_S="2") as router:
        completed = await _batch(router, 500)  # warm-up: first-use allocations, pools, caches
        before = router.rss_kb()
        for _ in range(15):
            completed += await _batch(router, 500)
        # Each TLS connection takes some 300 KB of the C heap while it lives (the loop's read
        # buffer, OpenSSL's state). Before the router gave that back, the 7,500 connections after
        # the warm-up kept 100-170 MB of it resident; now the process comes back to within a few
        # MB of where the warm-up left it. 20 MB leaves room for the process's own noise and for
        # a release not yet due, a tenth of what the bursts kept. Polled: memory given back, not
        # just not yet taken.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                while router.rss_kb() > before + 20 * 1024:
                    await asyncio.sleep(0.2)
        after = router.rss_kb()
        async with router.client() as http:
            assert (await http.get("/health")).status_code == 200
    # Served, not refused (a busy router cuts some at the deadline): 300 of every 500 were not
    # half-open.
    assert completed > 0.5 * 16 * 300, completed
    assert after <= before + 20 * 1024


def test_unusable_tls_files_stop_serve_before_it_listens(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    leaf = ca.issue("127.0.0.1")
    other = TestCA(tmp_path, "other").issue("127.0.0.1")
    config = write_profile(tmp_path / "p.yaml", profile(["http://127.0.0.1:1"]))
    argv = [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", str(free_port())]
    done = subprocess.run(
        [*argv, "--tls-cert", str(leaf.cert), "--tls-key", str(other.key)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "cannot serve TLS: --tls-cert: the key does not belong to the certificate" in done.stderr
    done = subprocess.run([*argv, "--tls-cert", str(leaf.cert)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--tls-cert and --tls-key" in done.stderr
