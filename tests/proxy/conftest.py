"""Event loops and scripted loopback servers for the proxy tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

import pytest
import uvloop

from tests.proxy.rawserver import ServeFn, raw_servers

# The upstream client runs under uvloop in production and plain asyncio elsewhere: its tests run on
# both. Other tests in this directory keep the default loop.
_BOTH_LOOPS: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
_DEFAULT_LOOP: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return _BOTH_LOOPS if item.path.name.startswith("test_upstream") else _DEFAULT_LOOP


@pytest.fixture
async def serve() -> AsyncIterator[ServeFn]:
    async with raw_servers() as start:
        yield start
