"""Processes of their own for tests (routers, servers): waiting for a router to be ready, and
stopping one."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

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
