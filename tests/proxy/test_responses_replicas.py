"""Router replicas sharing `state:` in a real Redis: a conversation begun through one is
continued, retrieved and refused to other keys through the other; an id is bound to its first
owner across replicas; a refused id asks Redis the same whatever this replica held."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Monitor

from router.config.models import RequestClass
from router.state.responseids import Holder
from tests.proxy.apistack import api_profile, client, sdk, start_router
from tests.support.fakebackend import FakeBackend
from tests.support.redisserver import RedisServer, redis_server
from tests.support.servers import server_group

pytestmark = pytest.mark.timeout(60)
MODEL = "fake-model"


async def test_a_conversation_continues_through_another_replica(tmp_path: Path) -> None:
    backends = [FakeBackend() for _ in range(2)]
    for i, backend in enumerate(backends):
        backend.api.tag = f"b{i}"
    async with redis_server(tmp_path) as redis, server_group() as group:
        urls = [await group.start(b) for b in backends]
        data = api_profile(urls, state={"redis_url": redis.url, "timeout_s": 2.0})
        (one, _), (two, _) = [await start_router(group, data) for _ in range(2)]
        async with sdk(one) as first_replica, sdk(two) as second_replica:
            began = [await first_replica.responses.create(model=MODEL, input=f"hi {i}") for i in range(2)]
            for first in began:
                where = first.output_text.split(" on ")[1]
                # The id's write to Redis runs in the background of the first replica: wait for it.
                async with redis.client() as probe:
                    while not await probe.exists(f"lane-router:resp:{first.id}"):
                        pass
                follow = await second_replica.responses.create(
                    model=MODEL, input="next", previous_response_id=first.id
                )
                assert follow.output_text == f"turn 2 on {where}"
                assert (await second_replica.responses.retrieve(first.id)).id == first.id
        async with client(two, "reader") as other:
            assert (await other.get(f"/v1/responses/{began[0].id}")).status_code == 404


class RedisLog:
    """Every command the Redis server runs (MONITOR), to compare what two requests asked of it."""

    def __init__(self, redis: RedisServer) -> None:
        self._client = redis.client()
        self._probe = redis.client()
        self.lines: list[tuple[str, list[str]]] = []  # (client type, the command's words)
        self._marks = 0
        self._seen = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RedisLog:
        monitor = self._client.monitor()
        await monitor.__aenter__()
        self._task = asyncio.ensure_future(self._read(monitor))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._client.aclose()
        await self._probe.aclose()

    async def _read(self, monitor: Monitor) -> None:
        try:
            async for info in monitor.listen():
                self.lines.append((info["client_type"], info["command"].split(" ")))
                self._seen.set()
        finally:
            await monitor.__aexit__()

    async def _mark(self) -> int:
        """A command of the test's own, and where the log holds it: what Redis ran before it is
        in the log before it."""
        self._marks += 1
        mark = f"test-mark:{self._marks}"
        await self._probe.get(mark)
        async with asyncio.timeout(5):
            while True:
                found = [i for i, (_, words) in enumerate(self.lines) if words[1:] == [mark]]
                if found:
                    return found[0]
                self._seen.clear()
                await self._seen.wait()

    async def during(
        self, request: Awaitable[httpx.Response], response_id: str
    ) -> tuple[int, tuple[str, ...]]:
        """The request's status, and the commands (who ran each and its name) that named the
        key of `response_id` while it ran."""
        begin = await self._mark()
        resp = await request
        end = await self._mark()
        key = f"lane-router:resp:{response_id}"
        return resp.status_code, tuple(
            f"{who} {words[0].upper()}" for who, words in self.lines[begin:end] if key in words
        )


async def test_a_refused_id_asks_redis_the_same_whether_held_here_for_another_key_or_unknown(
    tmp_path: Path,
) -> None:
    backends = [FakeBackend() for _ in range(2)]
    async with redis_server(tmp_path) as redis, server_group() as group:
        urls = [await group.start(b) for b in backends]
        data = api_profile(urls, state={"redis_url": redis.url, "timeout_s": 2.0})
        url, _ = await start_router(group, data)
        async with sdk(url) as api, client(url, "namer") as namer:
            held = await api.responses.create(model=MODEL, input="held here")
            warm = await namer.post(
                "/v1/responses", json={"model": MODEL, "input": "x", "request_id": "resp_warm"}
            )
            assert warm.status_code == 200  # the claim's script is loaded in Redis from now on
        async with redis.client() as probe:
            # The binding's background writes are over once Redis holds the response's usage: far
            # below the bounds it was first bound with (its prompt's and the whole context, 2048).
            await _until(probe, held.id, lambda h: h.tokens < 2048)
            elsewhere = Holder("api", "interactive", "http://10.9.9.9:8000", RequestClass.CHAT, 10)
            await probe.set("lane-router:resp:resp_elsewhere", elsewhere.encode())
        ids = {
            "held here for another key": held.id,
            "unknown": "resp_unknown7",
            "in Redis only": "resp_elsewhere",
        }
        async with RedisLog(redis) as log, client(url, "reader") as reader, client(url, "namer") as namer:
            for ask in (
                lambda rid: reader.get(f"/v1/responses/{rid}"),
                lambda rid: reader.post(f"/v1/responses/{rid}/cancel"),
                lambda rid: reader.post(
                    "/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": rid}
                ),
            ):
                seen = {what: await log.during(ask(rid), rid) for what, rid in ids.items()}
                assert set(seen.values()) == {(404, ("tcp GET",))}, seen
            claims = {
                what: await log.during(
                    namer.post("/v1/responses", json={"model": MODEL, "input": "x", "request_id": rid}), rid
                )
                for what, rid in ids.items()
                if what != "unknown"
            }
            assert set(claims.values()) == {(409, ("tcp EVALSHA", "lua GET"))}, claims
        assert sum(len(b.api.stored) for b in backends) == 2


async def _until(probe: Redis, response_id: str, holds: Callable[[Holder], bool]) -> None:
    async with asyncio.timeout(5):
        while True:
            raw = await probe.get(f"lane-router:resp:{response_id}")
            holder = Holder.decode(raw) if raw is not None else None
            if holder is not None and holds(holder):
                return


async def test_a_named_response_id_is_refused_through_every_replica(tmp_path: Path) -> None:
    backends = [FakeBackend() for _ in range(2)]
    async with redis_server(tmp_path) as redis, server_group() as group:
        urls = [await group.start(b) for b in backends]
        data = api_profile(urls, state={"redis_url": redis.url, "timeout_s": 2.0})
        (one, _), (two, _) = [await start_router(group, data) for _ in range(2)]
        async with sdk(one) as api, client(one, "namer") as namer_one, client(two, "namer") as namer_two:
            first = await api.responses.create(model=MODEL, input="mine")
            async with redis.client() as probe:
                await _until(probe, first.id, lambda h: h.key == "api")
            forwarded = sum(len(b.seen) for b in backends)
            for body in (
                {"model": MODEL, "input": "x", "request_id": first.id},
                {"model": MODEL, "input": "x", "request_id": first.id, "stream": True},
            ):
                resp = await namer_two.post("/v1/responses", json=body)
                assert (resp.status_code, resp.json()["error"]["code"]) == (409, "response_id_in_use")
            assert sum(len(b.seen) for b in backends) == forwarded
            assert (await api.responses.retrieve(first.id)).id == first.id
            # A claim is in Redis before its request goes out: the other replica refuses the id at once.
            named = {"model": MODEL, "input": "x", "request_id": "resp_named1"}
            assert (await namer_one.post("/v1/responses", json=named)).status_code == 200
            again = await namer_two.post("/v1/responses", json=named)
            assert (again.status_code, again.json()["error"]["code"]) == (409, "response_id_in_use")


async def test_an_id_redis_lost_in_a_restart_is_still_refused_to_another_key(tmp_path: Path) -> None:
    """Redis restarted empty: the replicas forgot whose the id was, the backend did not."""
    backends = [FakeBackend()]
    async with redis_server(tmp_path) as redis, server_group() as group:
        urls = [await group.start(b) for b in backends]
        data = api_profile(urls, state={"redis_url": redis.url, "timeout_s": 2.0, "recheck_s": 0.2})
        (one, _), (two, _) = [await start_router(group, data) for _ in range(2)]
        async with sdk(one) as api, client(two, "namer") as namer:
            first = await api.responses.create(model=MODEL, input="mine")
            async with redis.client() as probe:
                await _until(probe, first.id, lambda h: h.key == "api")
            await redis.stop()
            await redis.start()
            body = {"model": MODEL, "input": "x", "request_id": first.id, "store": False}
            async with asyncio.timeout(20):
                while (resp := await namer.post("/v1/responses", json=body)).status_code == 503:
                    await asyncio.sleep(0.05)  # the replica waits out its recheck before it asks Redis again
            assert (resp.status_code, resp.json()["error"]["code"]) == (409, "response_id_in_use")
            assert (await namer.get(f"/v1/responses/{first.id}")).status_code == 404
            assert (await api.responses.retrieve(first.id)).output_text == first.output_text
