"""Which backend holds each Responses-API response the router relayed, and for whom.

vLLM keeps a stored response (and the conversation `previous_response_id` continues) in the
memory of the server that made it, so a follow-up, a retrieve or a cancel must reach that
server. Each id is remembered with the key whose request created it — no other key reaches it —
the pool and backend (by origin) that answered, the class its lane served, and an upper bound of
the conversation's tokens through that response (its prompt bound plus its output bound), which a
follow-up adds to its own prompt's.

Each router process keeps at most `max_entries` ids for `ttl_s` (oldest dropped first). With
`state:` each id is also written to Redis with the same TTL, in the background, so another
replica finds it: a lookup asks this process's memory first, then Redis (bounded by the state's
timeout, failures counted as `response_store` / `response_lookup`), and a failed lookup is a miss."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis

from router.config.models import RequestClass, ResponseIdsConfig
from router.sharedstate import SharedState, SharedStateDown


@dataclass(frozen=True, slots=True)
class Holder:
    key: str
    pool: str
    backend: str  # the backend's origin, as the pool names it
    cls: RequestClass
    tokens: int

    def encode(self) -> bytes:
        return orjson.dumps([self.key, self.pool, self.backend, self.cls.value, self.tokens])

    @classmethod
    def decode(cls, raw: bytes) -> Holder | None:
        try:
            key, pool, backend, klass, tokens = orjson.loads(raw)
            return cls(str(key), str(pool), str(backend), RequestClass(klass), int(tokens))
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
        # Every entry lives ttl_s, so insertion order is expiry order: the oldest is first.
        self._ids: OrderedDict[str, tuple[float, Holder]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def remember(self, response_id: str, holder: Holder) -> None:
        now = self._clock()
        self._expire(now)
        self._ids[response_id] = (now + self.config.ttl_s, holder)
        self._ids.move_to_end(response_id)
        while len(self._ids) > self.config.max_entries:
            self._ids.popitem(last=False)
        if self.shared is not None:
            self._publish(self.shared, response_id, holder)

    async def recall(self, response_id: str) -> Holder | None:
        now = self._clock()
        self._expire(now)
        found = self._ids.get(response_id)
        if found is not None:
            return found[1]
        if self.shared is None:
            return None
        return await self._lookup(self.shared, response_id)

    def _expire(self, now: float) -> None:
        ids = self._ids
        while ids:
            expires, _ = next(iter(ids.values()))
            if expires > now:
                return
            ids.popitem(last=False)

    def _publish(self, shared: SharedState, response_id: str, holder: Holder) -> None:
        key, value = shared.key("resp", response_id), holder.encode()
        ms = max(1, round(self.config.ttl_s * 1000))

        async def call(client: Redis) -> object:
            return await client.set(key, value, px=ms)

        shared.spawn("response_store", call)

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
