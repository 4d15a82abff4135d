"""A 128 MB response head against the router running as its own process: the router reads no more
than the head limit plus one socket read, its memory stays put and it keeps answering others."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import yaml

from tests.proxy.rawserver import Request, backend, ok, raw_servers, stream_head_field
from tests.support.processes import wait_ready
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import free_port

WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
HEAD_LIMIT = 64 * 1024
ONE_READ = 256 * 1024
# What else the router reads meanwhile: the test's requests and its own health probes.
OTHER_READS = 64 * 1024
RSS_SLACK = 8 * 1024 * 1024


def _status(pid: int) -> tuple[int, int]:
    """The process's resident memory and the bytes it has read through read(2)-like calls."""
    rss = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    rchar = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/io").read_text().splitlines()
        if line.startswith("rchar:")
    )
    return rss, rchar


@contextlib.asynccontextmanager
async def router_process(config: Path) -> AsyncIterator[tuple[str, int]]:
    """`lane-router serve` with `config` on a free port, until ready; yields its URL and pid."""
    port = free_port()
    args = ("-m", "router", "serve", "--log-level", "error", "--config", str(config), "--port", str(port))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url)
        yield url, proc.pid
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 15)


async def _keep_probing(url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        while not stop.is_set():
            started = time.monotonic()
            resp = await client.get("/health")
            assert resp.status_code == 200
            latencies.append(time.monotonic() - started)


async def test_a_128mb_response_head_neither_grows_nor_stalls_the_router(tmp_path: Path) -> None:
    attack = asyncio.Event()
    written: list[int] = []
    answer = orjson.dumps({"id": "cmpl-1", "object": "chat.completion", "choices": []})

    async def reply(request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if not attack.is_set():
            writer.write(ok(answer, b"Content-Type: application/json\r\n"))
            return True
        written.append(await stream_head_field(writer, 128 * 1024 * 1024))
        return False

    async with raw_servers() as start:
        server = await start(backend(reply))
        config = tmp_path / "profile.yaml"
        config.write_text(yaml.safe_dump(profile([server.origin])))
        async with (
            router_process(config) as (url, pid),
            httpx.AsyncClient(base_url=url, timeout=20) as client,
        ):
            warm = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            assert warm.status_code == 200  # every module the request path imports is loaded
            rss_before, read_before = _status(pid)
            stop, latencies = asyncio.Event(), list[float]()
            prober = asyncio.create_task(_keep_probing(url, stop, latencies))
            attack.set()
            try:
                resp = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
                rss_after, read_after = _status(pid)
                probed = len(latencies)
                async with asyncio.timeout(5):
                    while len(latencies) < probed + 3:  # still answering after the attack
                        await asyncio.sleep(0.01)
            finally:
                stop.set()
                await prober
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_protocol_error"
    assert read_after - read_before <= HEAD_LIMIT + ONE_READ + OTHER_READS
    assert rss_after - rss_before <= RSS_SLACK
    assert written and written[0] < 128 * 1024 * 1024
    assert max(latencies) < 2.0
