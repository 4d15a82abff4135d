"""The memory of which backend holds each response id: its TTL and size cap, its Redis copy
shared by replicas, and ids bound to their first owner (claims, bindings that replace only what
they name)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from router.config.models import RequestClass, ResponseIdsConfig, StateConfig
from router.observe.metrics import Metrics
from router.state.responseids import Holder, ResponseIds
from router.state.shared import SharedState, SharedStateDown
from tests.support.redisserver import RedisServer, redis_server

HOLDER = Holder("web", "interactive", "http://10.0.0.1:8000", RequestClass.CHAT, 120)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_an_id_is_forgotten_after_its_ttl() -> None:
    clock = Clock()
    ids = ResponseIds(ResponseIdsConfig(ttl_s=10, max_entries=16), clock=clock)
    ids.bind("resp_a", HOLDER)
    clock.now = 9.9
    assert await ids.recall("resp_a", "web") == HOLDER
    clock.now = 10.0
    assert await ids.recall("resp_a", "web") is None
    assert len(ids) == 0


async def test_the_oldest_ids_go_first_past_the_cap() -> None:
    clock = Clock()
    ids = ResponseIds(ResponseIdsConfig(ttl_s=100, max_entries=16), clock=clock)
    for i in range(20):
        clock.now = i
        ids.bind(f"resp_{i}", HOLDER)
    assert len(ids) == 16
    assert await ids.recall("resp_3", "web") is None
    assert await ids.recall("resp_4", "web") == HOLDER


async def test_an_id_stays_with_its_first_owner() -> None:
    ids = ResponseIds(ResponseIdsConfig())
    claim = Holder("web", "interactive", "", RequestClass.CHAT, 0)
    assert claim.pending and not HOLDER.pending
    theirs = Holder("other", "interactive", "http://10.0.0.2:8000", RequestClass.CHAT, 5)
    assert ids.bind("resp_a", HOLDER)
    assert not ids.bind("resp_a", theirs)  # taken: not rebound
    assert not ids.bind("resp_a", theirs, (claim,))  # it replaces only what it names
    assert not await ids.claim("resp_a", claim)  # known: not claimed, for its owner either
    assert await ids.recall("resp_a", "other") is None
    counted = Holder("web", "interactive", "http://10.0.0.1:8000", RequestClass.CHAT, 12)
    assert ids.bind("resp_a", counted, (HOLDER,))
    assert await ids.recall("resp_a", "web") == counted
    # A claim, then its binding; a claim nothing was bound to is given back.
    assert await ids.claim("resp_b", claim)
    assert not ids.bind("resp_b", theirs)
    assert ids.bind("resp_b", HOLDER, (claim,))
    assert await ids.claim("resp_c", claim)
    ids.release("resp_c", claim)
    ids.release("resp_b", claim)  # bound since: not a claim any more, kept
    assert await ids.recall("resp_c", "web") is None
    assert await ids.recall("resp_b", "web") == HOLDER


async def test_a_claim_is_not_pushed_out_by_the_cap() -> None:
    """A claim lasts as long as its request: were it dropped with the oldest ids, another key
    could claim the id while the first request's response is still being made under it."""
    ids = ResponseIds(ResponseIdsConfig(ttl_s=100, max_entries=16))
    claim = Holder("web", "interactive", "", RequestClass.CHAT, 0)
    assert await ids.claim("resp_inflight", claim)
    for i in range(20):
        assert ids.bind(f"resp_{i}", HOLDER)
    assert len(ids) == 17  # the cap's 16, and the claim
    theirs = Holder("other", "interactive", "", RequestClass.CHAT, 0)
    assert not await ids.claim("resp_inflight", theirs)
    assert not ids.bind("resp_inflight", HOLDER)
    assert ids.bind("resp_inflight", HOLDER, (claim,))
    assert await ids.recall("resp_inflight", "web") == HOLDER
    assert await ids.claim("resp_other", claim)
    ids.release("resp_other", claim)
    assert len(ids) == 16 and await ids.claim("resp_other", theirs)


def test_a_holder_survives_its_encoding_and_garbage_is_no_holder() -> None:
    assert Holder.decode(HOLDER.encode()) == HOLDER
    assert Holder.decode(b"[1,2]") is None
    assert Holder.decode(b'["k","p","b","nope",1]') is None


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


async def test_replicas_share_ids_through_redis_and_a_dead_redis_is_a_counted_miss(
    redis: RedisServer,
) -> None:
    metrics = [Metrics(), Metrics()]
    states = [SharedState(StateConfig(redis_url=redis.url, timeout_s=2.0), redis.url, m) for m in metrics]
    try:
        a, b = (ResponseIds(ResponseIdsConfig(ttl_s=60), s) for s in states)
        a.bind("resp_shared", HOLDER)
        await states[0].release()  # waits for the background write
        states = states[1:]
        assert await b.recall("resp_shared", "web") == HOLDER
        assert await b.recall("resp_shared", "other") is None
        assert 0 < await redis.client().pttl("lane-router:resp:resp_shared") <= 60_000
        await redis.stop()
        assert await b.recall("resp_other", "web") is None
        labels = {"op": "response_lookup", "reason": "connection"}
        assert metrics[1].registry.get_sample_value("lane_router_shared_state_errors_total", labels) == 1.0
    finally:
        for state in states:
            await state.release()


async def test_a_claim_is_one_replicas_and_a_binding_never_takes_another_replicas_id(
    redis: RedisServer,
) -> None:
    states = [
        SharedState(StateConfig(redis_url=redis.url, timeout_s=2.0), redis.url, Metrics()) for _ in "ab"
    ]
    try:
        a, b = (ResponseIds(ResponseIdsConfig(ttl_s=60), s) for s in states)
        mine = Holder("web", "interactive", "", RequestClass.CHAT, 0)
        theirs = Holder("other", "interactive", "", RequestClass.CHAT, 0)
        won = await asyncio.gather(a.claim("resp_x", mine), b.claim("resp_x", theirs))
        assert sorted(won) == [False, True]
        winner, loser = (a, b) if won[0] else (b, a)
        (owner, other) = (mine, theirs) if won[0] else (theirs, mine)
        bound = Holder(owner.key, "interactive", "http://10.0.0.1:8000", RequestClass.CHAT, 9)
        assert winner.bind("resp_x", bound, (owner,))
        # The loser knows nothing of it in memory: its binding goes to Redis, which refuses it.
        assert loser.bind(
            "resp_x", Holder(other.key, "interactive", "http://10.0.0.2:8000", RequestClass.CHAT, 1)
        )
        for state in states:
            await state.release()  # waits for the background writes
        states = []
        raw = await redis.client().get("lane-router:resp:resp_x")
        assert raw is not None and Holder.decode(raw) == bound
    finally:
        for state in states:
            await state.release()


async def _absent(redis: RedisServer, key: str, within_s: float) -> bool:
    """Whether `key` is (or comes to be, within `within_s`) absent from Redis."""
    client = redis.client()
    try:
        async with asyncio.timeout(within_s):
            while await client.exists(key):
                await asyncio.sleep(0.02)
        return True
    except TimeoutError:
        return False
    finally:
        await client.aclose()


async def _stalled(redis: RedisServer) -> None:
    """Return once Redis stops answering (a PING waits past its timeout)."""
    async with asyncio.timeout(10):
        while True:
            probe = Redis.from_url(redis.url, socket_timeout=0.1)
            try:
                await probe.ping()
            except RedisTimeoutError:
                return
            finally:
                await probe.aclose()


async def test_a_claim_redis_answered_too_late_is_given_back_once_redis_answers(
    redis: RedisServer,
) -> None:
    cfg = StateConfig(redis_url=redis.url, timeout_s=0.3, recheck_s=0.2)
    state = SharedState(cfg, redis.url, Metrics())
    admin = Redis.from_url(redis.url, socket_timeout=30)
    try:
        ids = ResponseIds(ResponseIdsConfig(ttl_s=60), state)
        claim = Holder("web", "interactive", "", RequestClass.CHAT, 0)
        assert await ids.claim("resp_before", claim)  # a connection open, the script loaded
        # Redis stalls: the claim goes out, is given up after the timeout, and is run when Redis
        # resumes.
        stall = asyncio.ensure_future(admin.execute_command("DEBUG", "SLEEP", 5))
        await _stalled(redis)
        with pytest.raises(SharedStateDown):
            await ids.claim("resp_stalled", claim)
        await stall
        # Whatever Redis made of it, the id is not left claimed by a request that was refused.
        assert await _absent(redis, "lane-router:resp:resp_stalled", within_s=10)
        assert await ids.claim("resp_stalled", claim)
    finally:
        await admin.aclose()
        await state.release()


class Tap:
    """A loopback forwarder in front of Redis that tells when a client's bytes holding `word`
    have passed it (so a test knows a command went out)."""

    def __init__(self, port: int, word: bytes) -> None:
        self._port, self._word = port, word
        self.seen = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watch: bool) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
                if watch and self._word in chunk:
                    self.seen.set()
        except OSError:
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        for task in (
            asyncio.ensure_future(self._pipe(reader, up_writer, True)),
            asyncio.ensure_future(self._pipe(up_reader, writer, False)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()


async def test_a_claim_whose_request_went_away_while_redis_stalled_is_given_back(
    redis: RedisServer,
) -> None:
    tap = Tap(redis.port, b"resp_gone")
    admin = Redis.from_url(redis.url, socket_timeout=30)
    async with tap.serving() as url:
        state = SharedState(StateConfig(redis_url=url, timeout_s=8.0, recheck_s=0.2), url, Metrics())
        try:
            ids = ResponseIds(ResponseIdsConfig(ttl_s=60), state)
            claim = Holder("web", "interactive", "", RequestClass.CHAT, 0)
            assert await ids.claim("resp_before", claim)  # a connection open, the script loaded
            stall = asyncio.ensure_future(admin.execute_command("DEBUG", "SLEEP", 3))
            await _stalled(redis)
            # The claim goes out to the stalled Redis; its request is cancelled while it waits.
            claiming = asyncio.ensure_future(ids.claim("resp_gone", claim))
            async with asyncio.timeout(10):
                await tap.seen.wait()
            claiming.cancel()
            with pytest.raises(asyncio.CancelledError):
                await claiming
            await stall
            assert await _absent(redis, "lane-router:resp:resp_gone", within_s=10)
        finally:
            await admin.aclose()
            await state.release()
