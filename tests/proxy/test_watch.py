"""The disconnect watch: begun only once a request has run the profile's delay, and a client
that leaves after that cancels its request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.config.models import SlowClientConfig
from router.proxy.watch import Watchlist


class Exchange:
    answered = False


class Client:
    """An ASGI receive whose disconnect is sent when the test says so; it notes when it was
    first listened to (on the loop's clock)."""

    def __init__(self) -> None:
        self.listened_at: float | None = None
        self.listening = asyncio.Event()
        self.leave = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.listened_at is None:
            self.listened_at = asyncio.get_running_loop().time()
            self.listening.set()
        await self.leave.wait()
        return {"type": "http.disconnect"}


async def _request(watchlist: Watchlist, client: Client, started: list[float]) -> None:
    started.append(asyncio.get_running_loop().time())
    watch = watchlist.watch(Exchange(), client.receive)
    try:
        await asyncio.Event().wait()  # a request waiting on its backend
    finally:
        watchlist.drop(watch)


@pytest.mark.parametrize("after_s", [0.02, 0.15])
async def test_the_client_is_listened_to_only_after_the_delay(after_s: float) -> None:
    watchlist, client, started = Watchlist(after_s), Client(), []
    task = asyncio.create_task(_request(watchlist, client, started))
    await client.listening.wait()
    assert client.listened_at is not None
    # A watch due within a millisecond of another timer begins with it, never sooner.
    assert client.listened_at >= started[0] + after_s - 0.001
    client.leave.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(watchlist) == 0


async def test_a_request_that_ends_first_never_listens() -> None:
    watchlist, client, started = Watchlist(60.0), Client(), []
    task = asyncio.create_task(_request(watchlist, client, started))
    while not started:
        await asyncio.sleep(0)
    assert len(watchlist) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(watchlist) == 0 and client.listened_at is None


def test_the_delay_is_a_positive_profile_setting() -> None:
    assert SlowClientConfig().watch_disconnect_after_s == 0.02
    with pytest.raises(ValueError, match="watch_disconnect_after_s"):
        SlowClientConfig(watch_disconnect_after_s=0)
