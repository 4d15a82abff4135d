"""A router process's admission counts in Redis, shared with every other router process.

Each process holds its slots under a *holder* id, with a heartbeat key it renews every
`state.heartbeat_s` for LEASE_BEATS heartbeats (the lease). A take is one script
(router/state/slots/scripts.py `TAKE`): check the lane's and the backends' totals, charge the first
backend with room, answer with the counts. Releases are queued and sent together, at most one
script per turn of the event loop, in the background: a request never waits for its release.
Any process's heartbeat script drops the holders whose lease ran out, so the slots of a process
that died (SIGKILL included) come back by themselves within the lease plus one heartbeat of
whichever process is still alive.

The process keeps its own counts too (the `Backend` and `Lane` counters), and they are the
truth about what it holds. So when Redis fails — a take, a release or a heartbeat — the store
turns *local*: admission counts this process's own requests against its part of each limit
(router/state/slots/budget.py) and Redis is left alone. A process may hold more than its part while
counts are shared, so a lane's part is first reduced by what the other processes held beyond
theirs as far as it knows: every take's answer and every heartbeat say it, and a take beyond a
part is published to every process at once (`slots:over`; releases are learnt at the next
heartbeat, so the reduction errs on the safe side meanwhile). A holding a lane's 4 slots where
each part is 2 leaves B no slot of it until Redis is back. Slots taken in the instant before
Redis failed, whose news had not arrived, are not known; a WARNING and
`lane_router_shared_slots_inexact_total{reason="fallback"}` say so whenever a process falls back.
(The pools' per-backend prefill parts are not reduced so.) Once `recheck_s` has passed, the
next admission or heartbeat *re-homes*: one script drops every holder this process used before
and charges all it holds now under a new holder, so Redis again holds exactly what every
process holds, whatever was lost meanwhile (releases that failed, takes whose answer timed out
and were charged late, a Redis that restarted empty). A process starts local and re-homes at
its first heartbeat. Every change is tagged with its holder; changes of a holder that was
re-homed away are dropped, since the holder's whole count went with it.

A Redis that lost its data (restarted empty) must not grant the slots its holders still hold:
the first re-homing there opens a new *epoch* (router/state/slots/scripts.py `REHOME`) that names the
processes this one saw alive at its last heartbeat (with those an earlier such epoch still
awaited), and no slot is granted until each of them
has re-homed (each notices at its next heartbeat) or a lease has passed. A process that
re-homes holdings into such a Redis without having been awaited says so (WARNING,
`reason="late_rehome"`): slots may have been granted twice meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from router.state.shared import SharedState, SharedStateDown
from router.state.slots import scripts
from router.state.slots.arithmetic import UNKNOWN_HOLDER, SlotCounts, TakeRule

if TYPE_CHECKING:
    from router.fleet.backend import Backend
    from router.lanes.ticket import GatedLane

log = logging.getLogger("lane_router.slots")

LEASE_BEATS = 5  # a holder's slots outlive its last heartbeat by this many heartbeats
WATCH_IDLE_S = 5.0  # how long a subscription read waits for a message before reading again
CANCEL_AGAIN_S = 0.5  # how long closing waits for its tasks to end before cancelling them again
_STALE_KEPT = 8  # earlier holders remembered for dropping; one forgotten expires by its lease


class Mode(Enum):
    SHARED = "shared"
    LOCAL = "local"
    REHOMING = "rehoming"


@dataclass(frozen=True, slots=True)
class Change:
    """One counter of one slot hash, moved by `delta` under `holder`; `limit` (-1: none) says
    when giving back frees a full resource."""

    holder: str
    key: str
    counter: str
    delta: int
    limit: int = -1


@dataclass(frozen=True, slots=True)
class TakeAnswer:
    holder: str
    result: int  # the candidate taken (1-based), else router/state/slots/arithmetic.py's reasons
    lane_count: int
    counts: tuple[SlotCounts, ...]  # every candidate's, after the take
    excess: int = 0  # what other holders hold of the lane beyond their parts


class Holding(Protocol):
    """A pool gate, as the store sees it: what it holds, and whether anyone waits."""

    waiting: int

    def held(self) -> tuple[Iterable[Backend], Iterable[GatedLane]]: ...

    def lane_part(self, lane: GatedLane) -> int | None: ...

    def wake(self) -> None: ...


def limit_arg(limit: int | None) -> int:
    return -1 if limit is None else limit


class SlotStore:
    def __init__(self, state: SharedState) -> None:
        self.state = self._state = state
        client = state.client
        self._take = client.register_script(scripts.TAKE)
        self._adjust = client.register_script(scripts.ADJUST)
        self._beat = client.register_script(scripts.BEAT)
        self._rehome_script = client.register_script(scripts.REHOME)
        self.beat_s = state.config.heartbeat_s
        self.lease_s = LEASE_BEATS * self.beat_s
        self.mode = Mode.LOCAL
        self.run = _new_run()
        self._generation = 0
        self.holder = self._new_holder()
        self._peers: list[str] = []  # the other processes' runs, at the last heartbeat
        self._excess: dict[str, int] = {}  # per lane hash, at the last look
        self._looked_at: float | None = None
        self._epoch: str | None = None
        self._lost_holding = False
        self._inexact = state.metrics.shared_slots_inexact
        self._excess_gauge = state.metrics.shared_slots_excess
        self._stale: list[str] = []
        self._gates: weakref.WeakSet[Any] = weakref.WeakSet()
        self._pending: list[Change] = []
        self._flush_due = False
        self._flushing = 0
        self._rehoming: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._beating = self._watching = False
        self._keys = state.key("slots", "keys")
        self._holders = state.key("slots", "holders")
        self._hb_prefix = state.key("slots", "hb", "")
        self._epoch_key = state.key("slots", "epoch")
        self._expect_key = state.key("slots", "expect")
        self._lane_prefix = state.key("slots", "lane", "")
        self.channel = state.key("slots", "freed")
        self.over_channel = state.key("slots", "over")
        self._names: dict[tuple[str, str], str] = {}
        state.on_close(self.aclose)

    # -- the mode -------------------------------------------------------------------------

    @property
    def counts_shared(self) -> bool:
        """Whether releases go to Redis (now, or once the re-homing under way succeeds)."""
        return self.mode is not Mode.LOCAL

    def serves_locally(self) -> bool:
        """Whether admission counts locally now, without waiting: Redis failed moments ago."""
        return self.mode is Mode.LOCAL and not self._state.available()

    @property
    def releasing(self) -> bool:
        """Releases are on their way to Redis: whoever waits is woken once they are there."""
        return self._flushing > 0 or self._flush_due

    def counted_locally(self) -> None:
        self._state.skipped("slot_take")

    async def ready(self) -> bool:
        """Whether counts are shared now, re-homing first when that is due."""
        self._start_beating()
        if self.mode is Mode.SHARED:
            return True
        if self.mode is Mode.REHOMING or self._state.available():
            await self._rehome_once()
        return self.shared_now()

    def shared_now(self) -> bool:
        return self.mode is Mode.SHARED

    def register(self, gate: Holding) -> None:
        self._gates.add(gate)
        with contextlib.suppress(RuntimeError):  # no loop yet: `start` or the first admission
            asyncio.get_running_loop()
            self.start()

    def start(self) -> None:
        """Beat and listen from now on: an idle process re-homes, and learns what the others
        hold, too."""
        self._start_beating()
        self.watch()

    def excess(self, lane: GatedLane) -> int:
        """What other processes held of `lane` beyond their parts, at this one's last look."""
        return self._excess.get(self.lane_key(lane), 0)

    def lane_key(self, lane: GatedLane) -> str:
        return self._name("lane", lane.name)

    def backend_key(self, backend: Backend) -> str:
        return self._name("b", backend.name)

    def _name(self, kind: str, name: str) -> str:
        found = self._names.get((kind, name))
        if found is None:
            found = self._names[(kind, name)] = self._state.key("slots", kind, name)
        return found

    # -- taking and giving back -----------------------------------------------------------

    async def take(self, lane: GatedLane, order: Sequence[Backend], rule: TakeRule) -> TakeAnswer | None:
        """Charge the lane (if asked) and the first backend of `order` with room; None when
        Redis did not answer (the store is local now)."""
        holder = self.holder
        keys = [self._keys, self._hb_prefix + holder, self.lane_key(lane)]
        keys += [self.backend_key(b) for b in order]
        limits = rule.limits
        args = [
            holder,
            int(rule.take_lane),
            limit_arg(rule.lane_limit),
            int(rule.long),
            limit_arg(limits.max_prefilling),
            limit_arg(limits.max_long_prefilling),
            self._epoch_key,
            self._expect_key,
            limit_arg(rule.lane_part),
            self.over_channel,
        ]
        try:
            reply = await self._state.run("slot_take", _script(self._take, keys, args))
        except SharedStateDown:
            self._go_local()
            return None
        answer = TakeAnswer(
            holder=holder,
            result=int(reply[0]),
            lane_count=int(reply[1]),
            counts=_counts(reply[2:-1]),
            excess=int(reply[-1]),
        )
        if answer.result == UNKNOWN_HOLDER:
            self._lost(holder)
        elif self.mode is Mode.SHARED:
            self._saw({keys[2]: answer.excess})
        return answer

    def _saw(self, excess: dict[str, int]) -> None:
        """Note what other processes hold beyond their parts, as Redis just said."""
        self._excess.update(excess)
        self._looked_at = time.monotonic()
        for key, over in excess.items():
            self._excess_gauge.labels(key.removeprefix(self._lane_prefix)).set(over)

    def _heard_over(self, message: str) -> None:
        """Another process took a lane's slot beyond its part: one more to keep clear of should
        Redis fail before the next look (which replaces the count by Redis's own)."""
        holder, _, key = message.partition(" ")
        if _run_of(holder) != self.run and key:
            self._saw({key: self._excess.get(key, 0) + 1})

    def give_back(self, changes: Iterable[Change]) -> None:
        """Queue releases; they are sent together on the next turn of the event loop."""
        self._pending.extend(changes)
        if not self._flush_due and self.mode is Mode.SHARED:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_due = False
        if self.mode is not Mode.SHARED:
            return
        holder = self.holder
        batch = [c for c in self._pending if c.holder == holder]
        self._pending.clear()
        if batch:
            self._flushing += 1
            self._spawn(self._flush(holder, batch))

    async def _flush(self, holder: str, batch: list[Change]) -> None:
        try:
            known = await self._apply("slot_release", holder, batch)
        except SharedStateDown:
            self._go_local()
        else:
            if not known:
                self._lost(holder)
        finally:
            self._flushing -= 1
            self.wake_all()

    async def _apply(
        self,
        op: str,
        holder: str,
        changes: Sequence[Change],
        drop: Sequence[str] = (),
        register: bool = False,
    ) -> bool:
        """One `ADJUST` script; whether `holder` is known to Redis afterwards."""
        keys, moves = _grouped(changes)
        lease_ms = int(self.lease_s * 1000)
        args: list[Any] = [holder, lease_ms, self._hb_prefix, self.channel, int(register), len(drop), *drop]
        args += moves
        script_keys = [self._keys, self._holders, self._hb_prefix + holder, *keys]
        reply = await self._state.run(op, _script(self._adjust, script_keys, args))
        return bool(int(reply[0]))

    # -- re-homing ------------------------------------------------------------------------

    async def _rehome_once(self) -> None:
        if self._rehoming is None:
            self._rehoming = asyncio.ensure_future(self._rehome())
            self._rehoming.add_done_callback(self._rehomed)
        await asyncio.shield(self._rehoming)

    def _rehomed(self, _: asyncio.Future[None]) -> None:
        self._rehoming = None

    async def _rehome(self) -> None:
        self.mode = Mode.REHOMING
        self._stale = [*self._stale, self.holder][-_STALE_KEPT:]
        self.holder = holder = self._new_holder()
        held = self._held()
        try:
            reply = await self._state.run("slot_sync", self._rehome_call(holder, held))
        except SharedStateDown:
            self._go_local()
            return
        self._rehomed_into(_text(reply[0]), bool(int(reply[1]) or int(reply[2])), held)
        self._stale = []
        self.mode = Mode.SHARED
        self._start_beating()
        if self._pending:
            self._flush_due = True
            self._flush_now()
        self.wake_all()

    def _rehome_call(self, holder: str, held: Sequence[Change]) -> Callable[[Redis], Awaitable[Any]]:
        keys: list[str] = []
        position: dict[str, int] = {}
        charges: list[Any] = []
        for c in held:
            if c.key not in position:
                keys.append(c.key)
                position[c.key] = len(keys)
            charges += [position[c.key], c.counter, c.delta, c.limit]
        script_keys = [self._keys, self._holders, self._hb_prefix + holder, self._epoch_key, self._expect_key]
        lease_ms = int(self.lease_s * 1000)
        args: list[Any] = [holder, lease_ms, self._hb_prefix, self.channel, self.run, lease_ms]
        args += [len(self._stale), *self._stale, len(self._peers), *self._peers, *charges]
        return _script(self._rehome_script, [*script_keys, *keys], args)

    def _rehomed_into(self, epoch: str, expected: bool, held: Sequence[Change]) -> None:
        """Say so when this process re-homed holdings into a Redis that may have granted them
        to others meanwhile: one that lost its data without awaiting this process, or that
        dropped this process's holder (it missed its heartbeats for a lease)."""
        before, self._epoch = self._epoch, epoch
        lost, self._lost_holding = self._lost_holding, False
        # Each request holds one lane slot (and one backend's too, not counted again).
        holding = sum(c.delta for c in held if c.counter == "f" and c.key.startswith(self._lane_prefix))
        if not holding or expected or (before in (None, epoch) and not lost):
            return
        self._inexact.labels("late_rehome").inc()
        log.warning(
            "shared admission counts: this process re-homed %d request(s) it holds into Redis after "
            "%s; other processes may have been granted the same slots meanwhile, so the limits may "
            "be exceeded until these requests end",
            holding,
            "Redis lost its data" if before != epoch else "its holder was dropped",
        )

    def _held(self) -> list[Change]:
        """Everything the process's gates hold now, as charges (a lane's with this process's
        part of its limit)."""
        changes: list[Change] = []
        lanes: dict[GatedLane, int | None] = {}
        for gate in list(self._gates):
            backends, gate_lanes = gate.held()
            for b in backends:
                key = self.backend_key(b)
                for counter, n in (("f", b.in_flight), ("p", b.prefilling), ("l", b.long_prefilling)):
                    if n > 0:
                        changes.append(Change("", key, counter, n))
            for la in gate_lanes:
                lanes[la] = gate.lane_part(la)
        changes += [
            Change(holder="", key=self.lane_key(la), counter="f", delta=la.in_flight, limit=limit_arg(part))
            for la, part in lanes.items()
            if la.in_flight > 0
        ]
        return changes

    def _go_local(self, failed: bool = True) -> None:
        if self.mode is Mode.LOCAL:
            return
        shared, self.mode = self.mode is Mode.SHARED, Mode.LOCAL
        self._pending.clear()
        if failed and shared:  # once per outage: not again for every re-homing that fails
            self._fell_back()
        self.wake_all()  # whoever waits is served from this process's parts now

    def _fell_back(self) -> None:
        """Say what the parts this process now counts against are based on, and what they
        cannot know."""
        self._inexact.labels("fallback").inc()
        over = {k.removeprefix(self._lane_prefix): n for k, n in self._excess.items() if n > 0}
        age = "never" if self._looked_at is None else f"{time.monotonic() - self._looked_at:.1f} s ago"
        log.warning(
            "shared admission counts: Redis unavailable; each lane's part of this process is reduced "
            "by what other processes hold beyond theirs as far as it knows (last look at Redis %s: "
            "%s); slots they took since then are not known, so a lane may exceed its limit by them",
            age,
            ", ".join(f"{lane} {n}" for lane, n in sorted(over.items())) or "none",
        )

    def _lost(self, holder: str) -> None:
        """Redis no longer knows `holder` (reaped after a stall, or its data lost): re-home."""
        if holder == self.holder and self.mode is Mode.SHARED:
            log.warning("shared admission counts: this process's holder was dropped; re-homing")
            self._lost_holding = True
            self._go_local(failed=False)  # Redis answers: re-homing at once, not counting locally
            self._spawn(self._rehome_once())

    def wake_all(self) -> None:
        for gate in list(self._gates):
            if gate.waiting:
                gate.wake()

    # -- background: the heartbeat, and news of slots freed elsewhere ---------------------

    def _start_beating(self) -> None:
        if not self._beating:
            self._beating = True
            self._spawn(self._beat_forever())

    async def _beat_forever(self) -> None:
        while not self._closing:
            if self.mode is Mode.LOCAL and self._state.available():
                await self._rehome_once()
            # Counting locally, Redis's return is looked for as often as `recheck_s` allows.
            local = self.mode is not Mode.SHARED
            await asyncio.sleep(min(self.beat_s, self._state.config.recheck_s) if local else self.beat_s)
            if self.mode is Mode.SHARED:
                await self._beat_once()

    async def _beat_once(self) -> None:
        holder = self.holder
        keys = [self._keys, self._holders, self._epoch_key, self._expect_key]
        args = [holder, int(self.lease_s * 1000), self._hb_prefix, self.channel, self._lane_prefix]
        try:
            reply = await self._state.run("slot_beat", _script(self._beat, keys, args))
        except SharedStateDown:
            self._go_local()
            return
        known, dropped, alive = int(reply[0]), int(reply[1]), int(reply[2])
        if known:
            runs = {_run_of(_text(h)) for h in reply[3 : 3 + alive]}
            self._peers = sorted(runs - {self.run})
            lanes = reply[3 + alive :]
            seen = {_text(k): int(n) for k, n in zip(lanes[::2], lanes[1::2], strict=True)}
            self._saw({**dict.fromkeys(self._excess, 0), **seen})
        if int(dropped):
            log.info("shared admission counts: %d holder(s) without a heartbeat dropped", int(dropped))
        if not known:
            self._lost(holder)

    def watch(self) -> None:
        """Listen for slots freed by other processes, and for slots they take beyond their
        parts (from the start, or when someone first waits)."""
        if not self._watching:
            self._watching = True
            self._spawn(self._watch_forever())

    async def _watch_forever(self) -> None:
        while not self._closing:
            pubsub = self._state.client.pubsub()
            try:
                await self._state.run("slot_watch", _subscribe(pubsub, self.channel, self.over_channel))
                self.wake_all()  # anything freed before the subscription took effect
                while not self._closing:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=WATCH_IDLE_S)
                    if message is None:
                        continue
                    if _text(message["channel"]) == self.over_channel:
                        self._heard_over(_text(message["data"]))
                    else:
                        self.wake_all()
            except (SharedStateDown, RedisError, OSError):
                pass
            finally:
                with contextlib.suppress(RedisError, OSError):
                    # untyped in redis before 8.2, typed from 8.2 on: either passes the check
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
            await asyncio.sleep(self._state.config.recheck_s)

    def _new_holder(self) -> str:
        self._generation += 1
        return f"{self.run}/{self._generation}"

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if self._closing:
            work.close()  # closed: no background work starts any more
            return
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Stop the background work and give back what this process still holds."""
        self._closing = True
        tasks = list(self._tasks)
        while tasks:
            for task in tasks:
                task.cancel()
            # A cancellation that lands as the Redis client's own read timeout fires is taken for
            # that timeout and swallowed: cancel again until every task has ended.
            _, pending = await asyncio.wait(tasks, timeout=CANCEL_AGAIN_S)
            tasks = list(pending)
        if self.mode is Mode.SHARED:
            with contextlib.suppress(SharedStateDown):
                await self._apply("slot_sync", self.holder, (), drop=[self.holder])
        self.mode = Mode.LOCAL


def _subscribe(pubsub: Any, *channels: str) -> Callable[[Redis], Awaitable[None]]:
    async def call(_: Redis) -> None:
        await pubsub.subscribe(*channels)

    return call


def _new_run() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _run_of(holder: str) -> str:
    return holder.rpartition("/")[0] or holder


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _script(script: Any, keys: list[str], args: list[Any]) -> Callable[[Redis], Awaitable[Any]]:
    async def call(client: Redis) -> Any:
        return await script(keys, args, client)

    return call


def _counts(flat: Sequence[Any]) -> tuple[SlotCounts, ...]:
    values = [int(v) for v in flat]
    return tuple(SlotCounts(*values[i : i + 3]) for i in range(0, len(values), 3))


def _grouped(changes: Sequence[Change]) -> tuple[list[str], list[Any]]:
    """The slot hashes changes touch, and the changes summed per hash and counter, as the
    `ADJUST` script reads them."""
    sums: dict[tuple[str, str], list[int]] = {}
    for c in changes:
        found = sums.setdefault((c.key, c.counter), [0, c.limit])
        found[0] += c.delta
    keys: list[str] = []
    position: dict[str, int] = {}
    moves: list[Any] = []
    for (key, counter), (delta, limit) in sums.items():
        if key not in position:
            keys.append(key)
            position[key] = len(keys)
        moves += [position[key], counter, delta, limit]
    return keys, moves
