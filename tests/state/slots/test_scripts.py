"""The slot scripts, run by a real redis-server, against the Python arithmetic they mirror
(router/state/slots/arithmetic.py), on random states."""

from __future__ import annotations

import random
from typing import Any

from redis.asyncio import Redis

from router.lanes.admission import PrefillLimits
from router.state.slots import scripts
from router.state.slots.arithmetic import SETTLING, SlotCounts, TakeRule, release, take, taken
from tests.support.redisserver import RedisServer

HB = "t:hb:"
H = "h1"


def arg(limit: int | None) -> int:
    return -1 if limit is None else limit


def maybe(rng: random.Random, top: int) -> int | None:
    return None if rng.random() < 0.25 else rng.randint(0, top)


async def set_counts(client: Redis, key: str, counts: SlotCounts) -> None:
    await client.hset(
        key, mapping={"f": counts.in_flight, "p": counts.prefilling, "l": counts.long_prefilling}
    )


async def test_take_charges_exactly_what_the_arithmetic_allows(redis: RedisServer) -> None:
    rng = random.Random(11)
    client = redis.client()
    script = client.register_script(scripts.TAKE)
    try:
        for case in range(300):
            await client.flushdb()
            known = rng.random() < 0.9
            if known:
                await client.set(HB + H, "1")
            lane_count = rng.randint(0, 5)
            await client.hset("lane", "f", lane_count)
            candidates = []
            for i in range(rng.randint(1, 4)):
                p = rng.randint(0, 4)
                counts = SlotCounts(p + rng.randint(0, 3), p, rng.randint(0, p))
                candidates.append(counts)
                await set_counts(client, f"b{i}", counts)
            max_p = maybe(rng, 4)
            max_l = None if max_p is None else maybe(rng, max(0, max_p - 1))
            rule = TakeRule(
                rng.random() < 0.7, maybe(rng, 5), rng.random() < 0.5, PrefillLimits(max_p, max_l)
            )
            keys = ["keys", HB + H, "lane", *(f"b{i}" for i in range(len(candidates)))]
            args = [H, int(rule.take_lane), arg(rule.lane_limit), int(rule.long), arg(max_p), arg(max_l)]
            reply: list[Any] = await script(keys, args)

            expected = take(lane_count, candidates, rule, known)
            assert int(reply[0]) == expected, (case, reply, candidates, rule)
            after = list(candidates)
            if expected > 0:
                after[expected - 1] = taken(candidates[expected - 1], rule.long)
            flat = [int(v) for v in reply[2:-1]]
            assert flat == [n for c in after for n in (c.in_flight, c.prefilling, c.long_prefilling)]
            charged_lane = expected > 0 and rule.take_lane
            assert int(reply[1]) == lane_count + charged_lane
            assert int(await client.hget("lane", "f") or 0) == lane_count + charged_lane
            held = await client.hget(f"b{expected - 1}", f"f:{H}") if expected > 0 else None
            assert (held is not None) == (expected > 0)
    finally:
        await client.aclose()


async def test_a_release_gives_back_at_most_what_its_holder_holds(redis: RedisServer) -> None:
    rng = random.Random(5)
    client = redis.client()
    script = client.register_script(scripts.ADJUST)
    try:
        for case in range(300):
            await client.flushdb()
            await client.set(HB + H, "1")
            held = rng.randint(0, 4)
            total = held + rng.randint(0, 4)
            await client.hset("k", mapping={"p": total, **({f"p:{H}": held} if held else {})})
            amount, limit = rng.randint(1, 3), maybe(rng, 8)
            keys = ["keys", "holders", HB + H, "k"]
            args = [H, 10_000, HB, "chan", 0, 0, 1, "p", -amount, arg(limit)]
            reply: list[Any] = await script(keys, args)

            expected = release(total, held, amount, limit)
            assert int(reply[0]) == 1
            assert bool(int(reply[1])) == expected.frees, (case, total, held, amount, limit)
            assert int(await client.hget("k", "p") or 0) == expected.total
            assert int(await client.hget("k", f"p:{H}") or 0) == expected.held
            if expected.held == 0:
                assert not await client.hexists("k", f"p:{H}")
    finally:
        await client.aclose()


async def test_the_heartbeat_drops_holders_whose_lease_ran_out_and_forgets_empty_hashes(
    redis: RedisServer,
) -> None:
    client = redis.client()
    beat = client.register_script(scripts.BEAT)
    try:
        await client.set(HB + "alive", "1", px=60_000)
        await client.sadd("holders", "alive", "dead")
        await client.hset("b", mapping={"f": 5, "f:alive": 2, "f:dead": 3, "p": 1, "p:dead": 1})
        await client.hset("lane", mapping={"f": 3, "f:dead": 3})
        await client.sadd("keys", "b", "lane")

        known, dropped, *alive = await beat(["keys", "holders"], ["alive", 60_000, HB, "chan"])

        assert (int(known), int(dropped)) == (1, 1)
        assert alive == [1, b"alive"]
        assert await client.hgetall("b") == {b"f": b"2", b"f:alive": b"2", b"p": b"0"}
        assert await client.exists("lane") == 0  # nobody holds anything on it any more
        assert await client.smembers("keys") == {b"b"}
        assert await client.smembers("holders") == {b"alive"}
        assert int(await client.pttl(HB + "alive")) > 50_000

        known, *_ = await beat(["keys", "holders"], ["gone", 60_000, HB, "chan"])
        assert int(known) == 0  # a holder without a heartbeat is told, never renewed
        assert await client.exists(HB + "gone") == 0
    finally:
        await client.aclose()


async def test_an_empty_redis_grants_nothing_until_the_runs_seen_alive_have_re_homed(
    redis: RedisServer,
) -> None:
    client = redis.client()
    rehome, take = client.register_script(scripts.REHOME), client.register_script(scripts.TAKE)
    common = ["keys", "holders"]
    epoch = ["epoch", "expect"]

    async def join(run: str, peers: list[str], charges: list[Any]) -> list[Any]:
        holder = f"{run}/1"
        keys = [*common, HB + holder, *epoch, "lane"]
        args = [holder, 60_000, HB, "chan", run, 60_000, 0, len(peers), *peers, *charges]
        reply: list[Any] = await rehome(keys, args)
        return reply

    async def take_lane(run: str) -> int:
        holder = f"{run}/1"
        keys = ["keys", HB + holder, "lane", "b0"]
        args = [holder, 1, 4, 0, -1, -1, *epoch, 2]
        reply: list[Any] = await take(keys, args)
        return int(reply[0])

    try:
        # B re-homes first into the empty Redis: it saw A alive, so nothing is granted...
        created = await join("B", ["A"], [])
        assert [int(v) for v in created[1:]] == [1, 0, 1]  # created, not awaited, 1 run awaited
        assert await take_lane("B") == SETTLING
        # ... until A has charged the 4 slots it holds (its part being 2).
        joined = await join("A", ["B"], [1, "f", 4, 2])
        assert [int(v) for v in joined[1:]] == [0, 1, 0]
        assert await take_lane("B") == -1  # the lane is full: A holds all of it
        assert await client.hget("lane", "x:A/1") == b"2"
    finally:
        await client.aclose()
