"""The router's one mutable holder: the live runtime, and how it is replaced.

Reload (SIGHUP, a change of the profile file, `POST /admin/reload`) parses and validates the file,
builds a new runtime, and swaps it in one assignment. The new runtime reuses, with new settings,
every pool, backend and lane the file keeps (router/runtime.py says what carries over); requests
in flight keep the runtime they started on, which lets go of its pools once they have finished,
and what the file dropped closes as it drains (router/fleet.py). The old runtime is marked
superseded, which wakes the background work that follows the current one (router/health.py,
router/discovery.py). An invalid file changes nothing and the answer says why. So does, on a
router listening beyond loopback, a file that would bring in a key anyone can use
(router/keyhygiene.py)."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from router.config.checks import ConfigIssue
from router.config.load import ConfigError, load_profile
from router.config.models import ProfileConfig
from router.keyhygiene import is_loopback, key_issues, warning
from router.metrics import Metrics
from router.runtime import Runtime, build_runtime

log = logging.getLogger("lane_router.reload")


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    ok: bool
    reason: str
    profile: str
    issues: tuple[ConfigIssue, ...] = ()


class RouterState:
    """`bind_host` is where the router listens (router/settings.py `Settings.host`): beyond
    loopback, a reload may not bring in a guessable key."""

    def __init__(
        self,
        runtime: Runtime,
        metrics: Metrics,
        config_path: Path | None,
        *,
        drain_timeout_s: float = 300.0,
        bind_host: str = "127.0.0.1",
    ) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.config_path = config_path
        self._exposed = not is_loopback(bind_host)
        self._drain_timeout = drain_timeout_s
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    async def reload(self, trigger: str) -> ReloadOutcome:
        async with self._lock:
            outcome = self._swap(trigger)
        self.metrics.config_reloads.labels("success" if outcome.ok else "failure").inc()
        if outcome.ok:
            log.info("profile %r reloaded (%s)", outcome.profile, trigger)
        else:
            log.error("reload (%s) refused, %r keeps serving: %s", trigger, outcome.profile, outcome.reason)
        return outcome

    def _swap(self, trigger: str) -> ReloadOutcome:
        old = self.runtime
        if self.config_path is None:
            return ReloadOutcome(
                False, "the router runs the embedded profile; there is no file to reload", old.config.profile
            )
        try:
            cfg = load_profile(self.config_path)
            self._check_keys(cfg, str(self.config_path))
            new = build_runtime(cfg, self.metrics, previous=old)
        except ConfigError as err:
            return ReloadOutcome(False, str(err), old.config.profile, err.issues)
        except (OSError, ValueError) as err:
            return ReloadOutcome(False, f"{self.config_path}: {err}", old.config.profile)
        self.runtime = new
        old.superseded.set()
        new.fleet.sweep()  # what the reload dropped and nothing holds closes now
        task = asyncio.get_running_loop().create_task(old.close_when_drained(self._drain_timeout))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return ReloadOutcome(True, f"reloaded on {trigger}", cfg.profile)

    def _check_keys(self, cfg: ProfileConfig, source: str) -> None:
        """Refuses, as an invalid profile, guessable keys beyond loopback; warns of them on it.
        The environment is read here as `build_runtime` reads it, so `sha256_env` values count."""
        issues = key_issues(cfg.keys, os.environ)
        if issues and self._exposed:
            raise ConfigError(source, issues)
        if issues:
            log.warning("%s: %s", source, warning(issues))

    async def aclose(self) -> None:
        try:
            if self._closing:
                await asyncio.gather(*self._closing, return_exceptions=True)
        finally:
            await self.runtime.aclose()
