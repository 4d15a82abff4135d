"""`python -m router serve` as its own process on the router's HTTP server: its memory after
oversized heads, and SIGTERM ending an open stream with the router's shutdown event, whatever
the stream was waiting for, and at once on a second SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.httpserver.raw import Raw, request
from tests.support.fakebackend import Behaviour, FakeBackend
from tests.support.processes import last_error, stream_stopped_twice
from tests.support.profiles import KEYS, MODEL, auth, profile
from tests.support.servers import free_port, server_group

MB = 1 << 20


@dataclass
class RouterProcess:
    proc: asyncio.subprocess.Process
    port: int
    log: Path

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc status")

    async def until(self, path: str) -> None:
        """Wait until GET `path` answers 200."""
        async with asyncio.timeout(30):
            while True:
                with contextlib.suppress(OSError):
                    if await self.get(path) == 200:
                        return
                assert self.proc.returncode is None, self.log.read_text()
                await asyncio.sleep(0.05)

    async def metric(self, name: str) -> float:
        """A sample of the router's /metrics (0 when absent)."""
        client = await Raw.open(self.port)
        try:
            token = f"Authorization: Bearer {KEYS['scraper']}"
            client.send(request("GET", "/metrics", b"", token, "Connection: close"))
            for line in (await client.response()).body.decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            return 0.0
        finally:
            client.close()

    async def get(self, path: str) -> int:
        client = await Raw.open(self.port)
        try:
            client.send(request("GET", path, b"", "Connection: close"))
            return (await client.response()).status
        finally:
            client.close()


@contextlib.asynccontextmanager
async def router_process(
    tmp_path: Path,
    backends: list[str],
    ready_path: str = "/health",
    shape: Callable[[dict[str, Any]], None] | None = None,
    **env: str,
) -> AsyncIterator[RouterProcess]:
    """The router serving `profile(backends)` (changed by `shape`); `env`: its LANE_ROUTER_*
    settings."""
    config = tmp_path / "profile.yaml"
    data = profile(backends)
    if shape is not None:
        shape(data)
    config.write_text(yaml.safe_dump(data))
    port = free_port()
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "router", "serve", "--config", str(config), "--port", str(port)),
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **{f"LANE_ROUTER_{k.upper()}": v for k, v in env.items()}},
        )
    router = RouterProcess(proc, port, log)
    try:
        await router.until(ready_path)
        yield router
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _oversized_head(port: int, size: int) -> bytes:
    """Send a head of `size` bytes that never ends, 1 MB at a time, until the server stops it;
    what the server answered."""
    client = await Raw.open(port)
    answer = asyncio.create_task(client.closed(timeout=30))  # read while sending, as clients do
    piece = b"a" * MB
    try:
        client.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Endless: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(size // MB):
                if answer.done():
                    break
                client.send(piece)
                await client.writer.drain()
        return await answer
    finally:
        client.close()


@pytest.mark.timeout(90)
async def test_oversized_heads_leave_the_routers_memory_where_it_was(tmp_path: Path) -> None:
    async with router_process(tmp_path, [f"http://127.0.0.1:{free_port()}"]) as router:
        for _ in range(50):
            assert await router.get("/health") == 200
        before = router.rss_kb()
        answers = await asyncio.gather(*(_oversized_head(router.port, 32 * MB) for _ in range(8)))
        answers.append(await _oversized_head(router.port, 16 * MB))
        async with asyncio.timeout(15):  # memory given back, not just not yet taken
            while router.rss_kb() > before + 10 * 1024:
                await asyncio.sleep(0.1)
        assert await router.get("/health") == 200
        after = router.rss_kb()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert after <= before + 10 * 1024


@pytest.mark.timeout(60)
async def test_sigterm_ends_an_open_stream_with_the_shutdown_event_and_exits_cleanly(tmp_path: Path) -> None:
    backend = FakeBackend(Behaviour(tokens=10_000, itl_s=0.02))
    async with server_group() as group:
        backend_url = await group.start(backend)
        async with router_process(tmp_path, [backend_url], "/ready", graceful_shutdown_s="0.5") as router:
            client = await Raw.open(router.port)
            body = orjson.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            )
            client.send(
                request("POST", "/v1/chat/completions", body, *(f"{k}: {v}" for k, v in auth("user").items()))
            )
            head = await client.reader.readuntil(b"\r\n\r\n")
            await client.reader.readuntil(b"data: ")  # the stream is flowing
            router.proc.send_signal(signal.SIGTERM)
            rest = await client.closed(timeout=20)
            client.close()
            code = await asyncio.wait_for(router.proc.wait(), 20)
    log = router.log.read_text()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert rest.endswith(b"\r\n0\r\n\r\n")
    last_event = rest[: -len(b"\r\n0\r\n\r\n")].rsplit(b"data: ", 1)[1]
    error = orjson.loads(last_event.split(b"\n\n")[0])["error"]
    assert error["code"] == "server_shutdown"
    assert error["type"] == "service_unavailable"
    assert code == 0, log
    assert "Traceback" not in log, log


@pytest.mark.timeout(60)
async def test_a_second_sigterm_ends_an_open_stream_at_once_with_the_shutdown_event(tmp_path: Path) -> None:
    # The stream would run 200 s, the grace period is a minute: only the second signal ends it.
    backend = FakeBackend(Behaviour(tokens=10_000, itl_s=0.02))
    async with server_group() as group:
        backend_url = await group.start(backend)
        async with (
            router_process(tmp_path, [backend_url], "/ready", graceful_shutdown_s="60") as router,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.port}", timeout=30) as http,
        ):
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            status, body = await stream_stopped_twice(http, chat, auth("user"), router.proc.pid, router.log)
            code = await asyncio.wait_for(router.proc.wait(), 20)
    log = router.log.read_text()
    assert status == 200
    error = last_error(body)
    assert (error["code"], error["type"]) == ("server_shutdown", "service_unavailable")
    assert code == 0, log
    assert "Traceback" not in log, log


def _decoupled(data: dict[str, Any]) -> None:
    data["lanes"]["chat"]["decouple"] = True


@pytest.mark.timeout(90)
async def test_sigterm_ends_a_stream_waiting_on_a_client_that_does_not_read(tmp_path: Path) -> None:
    # The stream's task is cut while it waits for the client's socket to drain: the cancellation
    # comes through the future it awaits, into compiled coroutines that clean up and re-raise.
    backend = FakeBackend(Behaviour(tokens=100_000))
    async with server_group() as group:
        backend_url = await group.start(backend)
        async with router_process(
            tmp_path, [backend_url], "/ready", shape=_decoupled, graceful_shutdown_s="0.5"
        ) as router:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", router.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            client = Raw(reader, writer)
            body = orjson.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            )
            client.send(
                request("POST", "/v1/chat/completions", body, *(f"{k}: {v}" for k, v in auth("user").items()))
            )
            # Past what the sockets hold, the stream's buffer keeps what the client has not taken:
            # its relay waits for the client's socket.
            async with asyncio.timeout(30):
                while await router.metric("lane_router_stream_buffer_bytes") < MB:
                    await asyncio.sleep(0.05)
            router.proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(router.proc.wait(), 20)
            client.close()
    log = router.log.read_text()
    assert code == 0, log
    assert "Traceback" not in log, log


async def test_sighup_still_reloads_the_profile(tmp_path: Path) -> None:
    async with router_process(tmp_path, [f"http://127.0.0.1:{free_port()}"], watch_config="false") as router:
        config = tmp_path / "profile.yaml"
        data = yaml.safe_load(config.read_text())
        data["profile"] = "reloaded-by-signal"
        config.write_text(yaml.safe_dump(data))
        router.proc.send_signal(signal.SIGHUP)
        async with asyncio.timeout(15):
            while "'reloaded-by-signal' reloaded (SIGHUP)" not in router.log.read_text():
                await asyncio.sleep(0.05)
        assert await router.get("/health") == 200
        router.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(router.proc.wait(), 20) == 0


async def test_a_port_in_use_is_an_error_message_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "profile.yaml"
    config.write_text(yaml.safe_dump(profile([f"http://127.0.0.1:{free_port()}"])))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "router", "serve", "--config", str(config), "--port", str(port)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert f"cannot serve on 127.0.0.1:{port}" in output.decode()
    assert "Traceback" not in output.decode()
