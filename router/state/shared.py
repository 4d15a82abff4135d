"""The replicas' shared state: one Redis connection pool per profile's `state:` section, every
operation on it bounded in time, and what happens when Redis cannot answer. Rate limits and the
slow-client memory (router/state/redisstores.py), admission's counts (router/state/slots/) and the
Responses API's ids (router/state/responseids.py) live there.

An operation that fails (refused connection, timeout, error reply) raises `SharedStateDown` to
its store, which applies its policy (`router.state.redisstores`); it is counted in
`lane_router_shared_state_errors_total{op,reason}`. After a failure the replica stops asking
Redis for `recheck_s` — a dead or blackholed Redis must not add `timeout_s` to every request —
and counts the operations it skips as `reason="backoff"`. The log says when Redis goes away,
sums up every LOG_EVERY_S while it stays away, and says when it is back: one line per failed
request would drown everything else under load.

A reload that keeps the same `state:` section keeps the same `SharedState` (runtimes share it
by `retain`/`release`; the last release closes the pool)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from router.config.models import StateConfig
from router.errors import RETRY_AFTER_MAX_S
from router.observe.metrics import Metrics

log = logging.getLogger("lane_router.shared_state")

T = TypeVar("T")
Operation = Callable[[Redis], Awaitable[T]]

LOG_EVERY_S = 30.0
# Background writes (slow-client marks) still pending when the state is closed get this long.
CLOSE_GRACE_S = 1.0


class SharedStateDown(Exception):
    """Redis did not serve one operation: unreachable, too slow, an error reply, or skipped
    because it failed moments ago."""


def redis_url(cfg: StateConfig, env: Mapping[str, str]) -> str | None:
    """The URL to connect to, from the profile or from the variable it names."""
    if cfg.redis_url_env is not None:
        url = env.get(cfg.redis_url_env)
        if not url:
            raise ValueError(f"state.redis_url_env: environment variable {cfg.redis_url_env} is not set")
        return url
    return cfg.redis_url


def describe(url: str) -> str:
    """The URL without credentials, for logs."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    return f"{parts.scheme}://{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path}"


class OutageLog:
    """Log lines about Redis going away and coming back, at most one per `every_s` meanwhile."""

    def __init__(self, where: str, policy: str, every_s: float = LOG_EVERY_S) -> None:
        self._where = where
        self._policy = policy
        self._every = every_s
        self._down_since: float | None = None
        self._last_line = 0.0
        self._failures = 0
        self._since_line = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, op: str, reason: str, detail: str, now: float) -> None:
        self._failures += 1
        self._since_line += 1
        if self._down_since is None:
            self._down_since = self._last_line = now
            self._since_line = 0
            log.warning(
                "shared state at %s unavailable (%s: %s, %s); until it is back rate limits fail %s "
                "and admission counts fall back to this process's share of each limit",
                self._where,
                op,
                reason,
                detail,
                self._policy,
            )
        elif now - self._last_line >= self._every:
            log.warning(
                "shared state at %s still unavailable: %d operations failed or skipped in the last %.0f s",
                self._where,
                self._since_line,
                now - self._last_line,
            )
            self._last_line = now
            self._since_line = 0

    def recovered(self, now: float) -> None:
        if self._down_since is None:
            return
        log.warning(
            "shared state at %s is back after %.1f s (%d operations failed or skipped)",
            self._where,
            now - self._down_since,
            self._failures,
        )
        self._down_since = None
        self._failures = 0


class SharedState:
    def __init__(
        self,
        cfg: StateConfig,
        url: str,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = cfg
        self.url = url
        # No retries inside the client: one bounded attempt, then the policy answers.
        self.client: Redis = Redis.from_url(
            url,
            socket_timeout=cfg.timeout_s,
            socket_connect_timeout=cfg.timeout_s,
            retry=Retry(NoBackoff(), 0),
            max_connections=cfg.max_connections,
        )
        self.metrics = metrics
        self._errors = metrics.shared_state_errors
        self._clock = clock
        self._retry_at = 0.0
        self._log = OutageLog(describe(url), cfg.on_error)
        self._users = 1
        self._pending: set[asyncio.Task[None]] = set()
        self._closers: list[Callable[[], Awaitable[None]]] = []

    def key(self, *parts: str) -> str:
        return self.config.key_prefix + ":".join(parts)

    def same_as(self, cfg: StateConfig, url: str | None) -> bool:
        return self.config == cfg and self.url == url

    def available(self) -> bool:
        """Whether Redis may be asked now: not within `recheck_s` of a failure."""
        return self._clock() >= self._retry_at

    def retry_after_s(self) -> float:
        """What a request refused for want of Redis is told: the whole seconds until Redis is
        asked again (the rest of `recheck_s` after the last failure), within [1, a minute]."""
        return max(1.0, min(float(math.ceil(self._retry_at - self._clock())), RETRY_AFTER_MAX_S))

    def skipped(self, op: str) -> None:
        """Count an operation answered without Redis because it failed moments ago."""
        self._failed(op, "backoff", "waiting before trying again", self._clock())

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run `closer` when the last user releases the state, before its connections close."""
        self._closers.append(closer)

    async def run(self, op: str, operation: Operation[T]) -> T:
        """One bounded operation; `SharedStateDown` when Redis does not serve it."""
        now = self._clock()
        if now < self._retry_at:
            self._failed(op, "backoff", "waiting before trying again", now)
            raise SharedStateDown(op)
        try:
            async with asyncio.timeout(self.config.timeout_s):
                result = await operation(self.client)
        except (TimeoutError, RedisTimeoutError) as err:
            self._down(op, "timeout", err)
            raise SharedStateDown(op) from err
        except (RedisConnectionError, OSError) as err:
            self._down(op, "connection", err)
            # Idle connections to a server that went away are dead too: drop them now, so the
            # first requests after it is back do not each find one.
            with contextlib.suppress(RedisError, OSError):
                await self.client.connection_pool.disconnect(inuse_connections=False)
            raise SharedStateDown(op) from err
        except RedisError as err:
            self._down(op, "error", err)
            raise SharedStateDown(op) from err
        if self._log.down:
            self._log.recovered(self._clock())
        return result

    def spawn(self, op: str, operation: Operation[object]) -> None:
        """Run an operation in the background (a write nobody waits for); failures are counted
        and logged like any other."""
        task = asyncio.ensure_future(self._quietly(op, operation))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def spawn_until_done(self, op: str, operation: Operation[object], within_s: float) -> None:
        """`spawn`, for a write that must not be lost to a moment's outage (taking back what an
        unanswered operation may have written): tried again, once Redis may be asked, until it
        is done or `within_s` has passed."""
        task = asyncio.ensure_future(self._until_done(op, operation, self._clock() + within_s))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _quietly(self, op: str, operation: Operation[object]) -> None:
        with contextlib.suppress(SharedStateDown):
            await self.run(op, operation)

    async def _until_done(self, op: str, operation: Operation[object], deadline: float) -> None:
        while True:
            try:
                await self.run(op, operation)
                return
            except SharedStateDown:
                wait = max(self._retry_at - self._clock(), self.config.recheck_s / 10)
                if self._clock() + wait > deadline:
                    return
                await asyncio.sleep(wait)

    def _down(self, op: str, reason: str, err: BaseException) -> None:
        now = self._clock()
        self._retry_at = now + self.config.recheck_s
        self._failed(op, reason, str(err) or type(err).__name__, now)

    def _failed(self, op: str, reason: str, detail: str, now: float) -> None:
        self._errors.labels(op, reason).inc()
        self._log.failed(op, reason, detail, now)

    def retain(self) -> SharedState:
        self._users += 1
        return self

    async def release(self) -> None:
        self._users -= 1
        if self._users > 0:
            return
        try:
            for closer in self._closers:
                await closer()
            if self._pending:
                await asyncio.wait(self._pending, timeout=CLOSE_GRACE_S)
        finally:
            for task in self._pending:
                task.cancel()
            await self.client.aclose()
