from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.config.load import parse_profile
from router.server import build_state, make_app
from router.settings import Settings
from router.state.live import RouterState
from tests.support.fakebackend import FakeBackend, Seen
from tests.support.profiles import profile
from tests.support.servers import server_group


@dataclass
class Stack:
    url: str
    backends: list[FakeBackend]
    backend_urls: list[str]
    state: RouterState
    config_path: Path | None

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=10, **kwargs)

    def forwarded(self) -> int:
        return sum(len(b.seen) for b in self.backends)

    def seen(self) -> list[Seen]:
        return [s for b in self.backends for s in b.seen]

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `predicate()` holds, re-checking whenever any backend records a change."""
        async with asyncio.timeout(timeout):
            while not predicate():
                waits = [asyncio.ensure_future(b.changed.wait()) for b in self.backends]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()


@contextlib.asynccontextmanager
async def router_stack(
    n_backends: int = 2,
    shape: Callable[[list[str]], dict[str, Any]] | None = None,
    config_dir: Path | None = None,
    on_uvicorn: bool = False,
    **settings: Any,
) -> AsyncIterator[Stack]:
    """The router in front of `n_backends` fake backends, on its own HTTP server (or on
    uvicorn, as any other ASGI server would run it)."""
    backends = [FakeBackend() for _ in range(n_backends)]
    async with server_group() as group:
        urls = [await group.start(b) for b in backends]
        data = shape(urls) if shape else profile(urls)
        path = None
        if config_dir is not None:
            path = config_dir / "profile.yaml"
            path.write_text(yaml.safe_dump(data))
        state = build_state(parse_profile(data), path)
        if on_uvicorn:
            url = await group.start(make_app(state, Settings(config=path, **settings)))
        else:
            url = await group.serve_router(state, Settings(config=path, **settings))
        yield Stack(url, backends, urls, state, path)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with router_stack() as s:
        yield s
