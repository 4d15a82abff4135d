"""A real redis-server on a free loopback port, for the shared-state tests.

The binary comes from Debian's `redis-server` package (scripts/install-ci-tools.sh). Without it
the tests skip, unless LANE_ROUTER_REQUIRE_TOOLS=1 (as in CI), where they fail."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tests.deploy.tools import require_tool
from tests.support.processes import terminate
from tests.support.servers import free_port


class RedisServer:
    """One redis-server process without persistence; `stop` and `start` again on the same port
    play an outage and a recovery."""

    def __init__(self, binary: str, workdir: Path, args: Sequence[str] = ()) -> None:
        self._binary = binary
        self._args = list(args)  # after ours: a deployment's own arguments, say
        self._dir = workdir
        self.port = free_port()
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        argv = [
            self._binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._dir),
            "--loglevel", "warning",
            "--enable-debug-command", "local",  # DEBUG SLEEP: a stalled server
            *self._args,
        ]  # fmt: skip
        self._proc = proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(10):
            while not await self.ping():
                if proc.returncode is not None:
                    err = await proc.stderr.read() if proc.stderr else b""
                    raise RuntimeError(f"redis-server exited: {err.decode(errors='replace')}")
                await asyncio.sleep(0.02)

    async def ping(self) -> bool:
        client = Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(await client.ping())
        except (RedisError, OSError):
            return False
        finally:
            await client.aclose()

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await terminate(proc)

    def client(self) -> Redis:
        return Redis.from_url(self.url)


@contextlib.asynccontextmanager
async def redis_server(workdir: Path, args: Sequence[str] = ()) -> AsyncIterator[RedisServer]:
    server = RedisServer(require_tool("redis-server"), workdir, args)
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
