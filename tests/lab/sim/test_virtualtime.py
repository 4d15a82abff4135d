"""The virtual-time loop: sleeps cost no wall-clock time, and time stands while anything that can
still arrive (a socket's bytes, a thread's result) is outstanding."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.lab.sim.virtualtime import run_in_virtual_time


async def _ticking() -> asyncio.Task[None]:
    """A timer always due soon, as a busy simulated server has: the clock may jump to it."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.001)

    return asyncio.create_task(tick())


def test_a_day_of_sleep_passes_at_once() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(86_400)
        return loop.time() - start

    real = time.monotonic()
    assert run_in_virtual_time(main()) == pytest.approx(86_400)
    assert time.monotonic() - real < 60  # a real day's sleep would be the failure


def test_time_stands_while_a_loopback_answer_is_on_its_way() -> None:
    async def main() -> tuple[float, bytes]:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readexactly(5))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        ticker = await _ticking()
        try:
            port = server.sockets[0].getsockname()[1]
            loop = asyncio.get_running_loop()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = loop.time()
            writer.write(b"hello")
            answer = await reader.readexactly(5)
            elapsed = loop.time() - start
            writer.close()
            return elapsed, answer
        finally:
            ticker.cancel()
            server.close()
            await server.wait_closed()

    elapsed, answer = run_in_virtual_time(main())
    assert answer == b"hello"
    assert elapsed == 0.0


def test_time_stands_while_a_thread_works_for_the_loop() -> None:
    async def main() -> float:
        ticker = await _ticking()
        try:
            loop = asyncio.get_running_loop()
            start = loop.time()
            await loop.run_in_executor(None, time.sleep, 0.2)
            return loop.time() - start
        finally:
            ticker.cancel()

    assert run_in_virtual_time(main()) == 0.0
