"""Which backend holds each Responses-API response the router relayed, and for whom.

vLLM keeps a stored response (and the conversation `previous_response_id` continues) in the
memory of the server that made it, so a follow-up, a retrieve or a cancel must reach that
server. Each id is remembered with the key whose request created it — no other key reaches it —
the pool and backend (by origin) that answered, the class its lane served, and the tokens of the
conversation through that response (what the backend reported, or the turn's bounds while that
is unknown), which a follow-up adds to its own prompt's bound.

An id is bound to its first owner for its lifetime: a binding only ever replaces one it names
(a claim by the same request, the same response's earlier binding) or nothing. A request that
names its response's id itself (vLLM's `request_id`) first *claims* it — a pending holder, no
backend yet — and is refused if the id is known; the claim becomes the binding when the
response passes, or is released when none did.

Each router process keeps at most `max_entries` ids for `ttl_s` (oldest dropped first), and
besides them the claims of the requests under way (a claim lasts as long as its request). With
`state:` each id is also written to Redis with the same TTL, so another replica finds it: writes
of bindings run in the background (one script that replaces only what it names, so replicas
never take each other's ids), a claim waits for Redis (set if absent, atomically), and a lookup
that this process cannot answer for the asking key asks Redis, whether this process holds the
id for another key or not at all — so the refusal takes the same path, and the same time, for
both. Failures are counted as `response_store` / `response_lookup` / `response_claim`; a failed
lookup is a miss, a failed claim raises `SharedStateDown`."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from redis.asyncio import Redis
from redis.commands.core import AsyncScript as Script

from router.config.models import RequestClass, ResponseIdsConfig
from router.state.shared import SharedState, SharedStateDown

# KEYS[1] the id's key. ARGV[1] the new value ('' deletes), ARGV[2] its TTL in ms, ARGV[3..] the
# values it may replace. Absent, or holding one of those: replaced; returns 1, else 0.
_REPLACE: Final = """
local cur = redis.call('GET', KEYS[1])
local ok = not cur
for i = 3, #ARGV do
  if cur == ARGV[i] then ok = true end
end
if not ok then return 0 end
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# KEYS[1] the id's key. ARGV[1] the claim, ARGV[2] its TTL in ms, ARGV[3] '1' when this process
# already knows the id: then nothing is written, only the same lookup made. Returns 1 if claimed.
_CLAIM: Final = """
local cur = redis.call('GET', KEYS[1])
if cur or ARGV[3] == '1' then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


@dataclass(frozen=True, slots=True)
class Holder:
    key: str
    pool: str
    backend: str  # the backend's origin, as the pool names it; "" while only claimed
    cls: RequestClass
    tokens: int

    @property
    def pending(self) -> bool:
        """A claim: the id is taken, but no backend holds a response of that id yet."""
        return not self.backend

    def encode(self) -> bytes:
        return orjson.dumps([self.key, self.pool, self.backend, self.cls.value, self.tokens])

    @classmethod
    def decode(cls, raw: bytes) -> Holder | None:
        try:
            key, pool, backend, klass, tokens = orjson.loads(raw)
            return cls(
                key=str(key),
                pool=str(pool),
                backend=str(backend),
                cls=RequestClass(klass),
                tokens=int(tokens),
            )
        except (orjson.JSONDecodeError, ValueError, TypeError):
            return None


class ResponseIds:
    def __init__(
        self,
        cfg: ResponseIdsConfig,
        shared: SharedState | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = cfg
        self.shared = shared
        self._clock = clock
        # Every entry lives ttl_s from its first binding, so insertion order is expiry order.
        self._ids: OrderedDict[str, tuple[float, Holder]] = OrderedDict()
        # Claims, apart: each lasts as long as its request (which binds or releases it), so
        # neither the cap nor the TTL may drop one while its response is being made.
        self._claims: dict[str, Holder] = {}
        self._scripts: tuple[SharedState, Script, Script] | None = None  # replace, claim

    def __len__(self) -> int:
        return len(self._ids) + len(self._claims)

    def _known(self, response_id: str) -> bool:
        return response_id in self._ids or response_id in self._claims

    async def claim(self, response_id: str, holder: Holder) -> bool:
        """Take `response_id` for `holder` (a pending one) if no one has it: False when it is
        known here or, with shared state, to any replica. `SharedStateDown` when Redis cannot
        say."""
        self._expire(self._clock())
        known = self._known(response_id)
        shared = self.shared
        if shared is not None:
            try:
                claimed = await self._claim(shared, response_id, holder, known)
            except BaseException:
                # Unanswered is not unwritten (a timeout, or the request gone meanwhile): Redis
                # may run the claim once it resumes.
                self._publish(shared, response_id, b"", (holder,), until_done=True)
                raise
            if claimed and self._known(response_id):
                # Bound or claimed here while Redis answered: Redis's claim is not to stay.
                self._publish(shared, response_id, b"", (holder,), until_done=True)
            known = known or not claimed or self._known(response_id)
        if known:
            return False
        self._claims[response_id] = holder
        return True

    def bind(self, response_id: str, holder: Holder, replaces: tuple[Holder, ...] = ()) -> bool:
        """Bind `response_id` to `holder` if no one holds it or it holds one of `replaces`;
        whether it did. Never takes an id from another owner."""
        now = self._clock()
        self._expire(now)
        found = self._ids.get(response_id)
        claim = self._claims.get(response_id)
        if claim is not None:
            if claim not in replaces:
                return False
            del self._claims[response_id]
            self._put(response_id, holder)
        elif found is None:
            self._put(response_id, holder)
        elif found[1] in replaces:
            self._ids[response_id] = (found[0], holder)  # in place: its expiry stays its place
        else:
            return False
        if self.shared is not None:
            self._publish(self.shared, response_id, holder.encode(), replaces)
        return True

    def release(self, response_id: str, claim: Holder) -> None:
        """Give back a claim no response was bound to (if it is still that claim)."""
        if self._claims.get(response_id) == claim:
            del self._claims[response_id]
        if self.shared is not None:
            # Lost, it would keep the id from everyone for the TTL: done however long Redis is out.
            self._publish(self.shared, response_id, b"", (claim,), until_done=True)

    async def recall(self, response_id: str, key: str) -> Holder | None:
        """The holder of `response_id` if `key` owns it, else None."""
        self._expire(self._clock())
        found = self._ids.get(response_id)
        held = found[1] if found is not None else self._claims.get(response_id)
        if held is not None and held.key == key:
            return held
        if self.shared is None:
            return None
        # Another key's id held here is looked up in Redis like an id unknown here: the answer
        # then takes the same path, and time, whichever it was.
        shared = await self._lookup(self.shared, response_id)
        if held is None and shared is not None and shared.key == key:
            return shared
        return None

    def _put(self, response_id: str, holder: Holder) -> None:
        self._ids[response_id] = (self._clock() + self.config.ttl_s, holder)
        self._ids.move_to_end(response_id)
        while len(self._ids) > self.config.max_entries:
            self._ids.popitem(last=False)

    def _expire(self, now: float) -> None:
        ids = self._ids
        while ids:
            expires, _ = next(iter(ids.values()))
            if expires > now:
                return
            ids.popitem(last=False)

    def _script(self, shared: SharedState, claim: bool) -> Script:
        """The script registered with `shared` (a reload may hand over another state)."""
        scripts = self._scripts
        if scripts is None or scripts[0] is not shared:
            client = shared.client
            scripts = self._scripts = (
                shared,
                client.register_script(_REPLACE),
                client.register_script(_CLAIM),
            )
        return scripts[2] if claim else scripts[1]

    def _ttl_ms(self) -> int:
        return max(1, round(self.config.ttl_s * 1000))

    def _publish(
        self,
        shared: SharedState,
        response_id: str,
        value: bytes,
        replaces: tuple[Holder, ...],
        until_done: bool = False,
    ) -> None:
        key = shared.key("resp", response_id)
        args: list[Any] = [value, self._ttl_ms(), *(h.encode() for h in replaces)]
        script = self._script(shared, claim=False)

        async def call(client: Redis) -> object:
            return await script([key], args, client)

        if until_done:
            shared.spawn_until_done("response_store", call, self.config.ttl_s)
        else:
            shared.spawn("response_store", call)

    async def _claim(self, shared: SharedState, response_id: str, holder: Holder, known: bool) -> bool:
        key = shared.key("resp", response_id)
        args: list[Any] = [holder.encode(), self._ttl_ms(), "1" if known else "0"]
        script = self._script(shared, claim=True)

        async def call(client: Redis) -> Any:
            return await script([key], args, client)

        return bool(await shared.run("response_claim", call))

    async def _lookup(self, shared: SharedState, response_id: str) -> Holder | None:
        key = shared.key("resp", response_id)

        async def call(client: Redis) -> bytes | None:
            raw = await client.get(key)
            return raw if isinstance(raw, bytes) or raw is None else raw.encode()

        try:
            raw = await shared.run("response_lookup", call)
        except SharedStateDown:
            return None
        return None if raw is None else Holder.decode(raw)
