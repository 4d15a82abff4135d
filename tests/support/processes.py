"""Processes of their own for tests (routers, servers): waiting for a router to be ready,
stopping one, and stopping one twice under a stream."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import orjson

from router.lab.procs import stop as stop  # one SIGTERM-then-SIGKILL rule for the lab and the tests


async def wait_ready(url: str, timeout: float = 30.0) -> None:
    """Until `url` answers /ready with 200 (connection errors while it starts are expected)."""
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as client, asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.05)


async def terminate(proc: asyncio.subprocess.Process, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `grace_s` (an asyncio child)."""
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        async with asyncio.timeout(grace_s):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def stream_stopped_twice(
    client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], pid: int, log: Path
) -> tuple[int, bytes]:
    """Stream a chat completion; once it flows, SIGTERM `pid`, and again once the router (or a
    worker) logs that it is stopping with the request in progress. The status and the whole body
    as httpx read it: it raises unless the body ended as its framing says."""
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        received = b""
        chunks = resp.aiter_bytes()
        async with asyncio.timeout(30):
            while b"data: " not in received:
                received += await anext(chunks)
            os.kill(pid, signal.SIGTERM)
            while not _says(log, "stopping: 1 request(s) in progress"):
                await asyncio.sleep(0.05)
        os.kill(pid, signal.SIGTERM)
        async for chunk in chunks:
            received += chunk
    return resp.status_code, received


def _says(log: Path, text: str) -> bool:
    return text in log.read_text()


def last_error(body: bytes) -> dict[str, Any]:
    """The error of the last SSE event of `body`."""
    event = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert event.startswith(b"data: "), body[-300:]
    error: dict[str, Any] = orjson.loads(event[len(b"data: ") :])["error"]
    return error
