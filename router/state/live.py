"""The router's one mutable holder: the live runtime, and how it is replaced.

Reload (SIGHUP, a change of the profile file, `POST /admin/reload`) parses and validates the file,
builds a new runtime, and swaps it in one assignment. SIGHUP and `POST /admin/reload` re-read the
listener's TLS files as well (`reload_files`); under a supervisor, `POST /admin/reload` reaches
every worker that way (`reload_everywhere`, router/supervisor/workerlink.py). The new runtime
reuses, with new settings, every pool, backend and lane the file keeps (router/state/runtime.py
says what carries over); requests in flight keep the runtime they started on, which lets go of its
pools once they have finished, and what the file dropped closes as it drains
(router/fleet/fleet.py). The old runtime is marked superseded, which wakes the background work that
follows the current one (router/fleet/health.py, router/fleet/discovery.py). An invalid file
changes nothing and the answer says why. So does, on a router listening beyond loopback, a file
that would bring in a key anyone can use (router/keys/hygiene.py), and a file with
`health.on_drift: refuse` whose pools differ from their live servers (router/fleet/health.py)."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.config.checks import ConfigIssue
from router.config.load import ConfigError, load_profile
from router.config.models import ProfileConfig
from router.fleet.health import reload_drift
from router.keys.hygiene import is_loopback, key_issues, warning
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from router.tls.serving import ServingTls

log = logging.getLogger("lane_router.reload")

# What a reload did with the listener's TLS files.
TLS_NONE = "none"  # the listener serves plain HTTP
TLS_RELOADED = "reloaded"
TLS_REFUSED = "refused"  # unusable files: the previous certificate keeps serving
EMBEDDED = "the router runs the embedded profile; there is no file to reload"


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    ok: bool
    reason: str
    profile: str
    issues: tuple[ConfigIssue, ...] = ()


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What one process did when asked to reload its files: the profile's outcome and the TLS
    files'. `worker`: its number under a supervisor; `answered` False: a worker that did not
    say (not running, or no answer in time), `outcome.reason` says which."""

    outcome: ReloadOutcome
    tls: str = TLS_NONE
    tls_reason: str = ""
    worker: int | None = None
    answered: bool = True

    @property
    def ok(self) -> bool:
        return self.answered and self.outcome.ok and self.tls != TLS_REFUSED

    @property
    def reason(self) -> str:
        """Why it is not `ok` (the profile's reason first), or the profile's reload reason."""
        if self.answered and self.outcome.ok and self.tls == TLS_REFUSED:
            return self.tls_reason
        return self.outcome.reason

    def to_json(self) -> dict[str, Any]:
        result = "reloaded" if self.ok else "refused" if self.answered else "no_answer"
        return {
            "worker": self.worker,
            "result": result,
            "profile": self.outcome.profile,
            "profile_reloaded": self.outcome.ok,
            "profile_reason": self.outcome.reason,
            "reason": self.reason,
            "issues": [{"path": i.path, "message": i.message} for i in self.outcome.issues],
            "tls": self.tls,
            "tls_reason": self.tls_reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReloadReport:
        """A report as `to_json` wrote it, or as the supervisor wrote a missing one."""
        worker = data["worker"]
        if data["result"] == "no_answer":
            return cls.missing(worker, str(data["reason"]))
        issues = tuple(ConfigIssue(str(i["path"]), str(i["message"])) for i in data["issues"])
        outcome = ReloadOutcome(
            bool(data["profile_reloaded"]), str(data["profile_reason"]), str(data["profile"]), issues
        )
        return cls(outcome, str(data["tls"]), str(data["tls_reason"]), worker)

    @classmethod
    def missing(cls, worker: int, reason: str) -> ReloadReport:
        return cls(ReloadOutcome(False, reason, ""), worker=worker, answered=False)


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
        tls: ServingTls | None = None,
    ) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.config_path = config_path
        self.tls = tls
        self.worker: int | None = None  # this process's number under a supervisor
        self._exposed = not is_loopback(bind_host)
        self._drain_timeout = drain_timeout_s
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    async def reload_everywhere(self, trigger: str) -> list[ReloadReport]:
        """`reload_files` in every process serving this router's port: here, this one."""
        return [await self.reload_files(trigger)]

    async def reload_files(self, trigger: str) -> ReloadReport:
        """Re-read the TLS files (if served) and the profile file, as SIGHUP does. Without a
        profile file, the TLS files alone; neither is a refusal."""
        tls = self.tls
        if tls is None:
            return ReloadReport(await self.reload(trigger))
        refused = tls.reload()
        if self.config_path is not None:
            outcome = await self.reload(trigger)
        else:
            outcome = ReloadOutcome(False, EMBEDDED, self.runtime.config.profile)
        return ReloadReport(outcome, TLS_REFUSED if refused else TLS_RELOADED, refused)

    async def reload(self, trigger: str) -> ReloadOutcome:
        async with self._lock:
            outcome = await self._refuse_drift()
            if outcome is None:
                outcome = self._swap(trigger)
        self.metrics.config_reloads.labels("success" if outcome.ok else "failure").inc()
        if outcome.ok:
            log.info("profile %r reloaded (%s)", outcome.profile, trigger)
        else:
            log.error("reload (%s) refused, %r keeps serving: %s", trigger, outcome.profile, outcome.reason)
        return outcome

    async def _refuse_drift(self) -> ReloadOutcome | None:
        """The refusal of a profile that refuses drift while its servers differ from it (an
        unusable file is left to `_swap`, which says why)."""
        if self.config_path is None:
            return None
        try:
            cfg = load_profile(self.config_path)
        except ConfigError:
            return None
        drift = await reload_drift(cfg, self.runtime, os.environ)
        if not drift:
            return None
        issues = tuple(ConfigIssue("health.on_drift", f"refuse: {line}") for line in drift)
        reason = f"{self.config_path}: the live servers differ from it (health.on_drift: refuse): "
        return ReloadOutcome(False, reason + "; ".join(drift), self.runtime.config.profile, issues)

    def _swap(self, trigger: str) -> ReloadOutcome:
        old = self.runtime
        if self.config_path is None:
            return ReloadOutcome(False, EMBEDDED, old.config.profile)
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
