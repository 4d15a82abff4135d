"""Real vLLM server pairs started ahead of the tests that use them.

A pair's start-up (imports, model load, engine start: 40–180 s) used to happen inside its fixture
while the run did nothing else. Once collection ends the run knows which pairs its tests use and in
which order: the launcher starts the first then and each next one once the one before is healthy
(checked between tests), so each start-up overlaps the tests that run meanwhile and only one pair
starts at a time on this 2-core machine. A fixture adopts its pair's processes and waits for their
health; a pair not started yet is started by its fixture, as before. Whatever the launcher started
and no fixture adopted is stopped when the session ends, however it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from router.lab.realvllm.install import VllmInstall, VllmSetupMissing, locate
from router.lab.realvllm.server import VllmServer

# Between tests, a pair still starting is asked for its health at most this often, and briefly:
# a server that accepts before it can answer must not hold the tests up.
POLL_EVERY_S = 3.0
HEALTH_TIMEOUT_S = 0.2

Build = Callable[[VllmInstall, Path], Sequence[VllmServer]]


@dataclass(frozen=True)
class PairSpec:
    """A server pair: the fixture that serves it, the models it needs and how its handles are made."""

    fixture: str
    sizes: tuple[str, ...]
    build: Build


@dataclass
class Started:
    servers: Sequence[VllmServer]
    began: float  # time.monotonic() when its processes were started
    seen_healthy: int = 0  # servers[:seen_healthy] answered their health check

    def settled(self) -> bool:
        """Every server answers its health check or has exited (its fixture reports why). Asks
        only the first server not yet seen healthy, so a poll costs one short request."""
        while self.seen_healthy < len(self.servers):
            server = self.servers[self.seen_healthy]
            if server.running() and not healthy(server):
                return False
            self.seen_healthy += 1
        return True


def healthy(server: VllmServer) -> bool:
    try:
        return httpx.get(f"{server.url}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except httpx.TransportError:
        return False


def start_all(servers: Sequence[VllmServer]) -> None:
    """Start every server; on a failure stop those already started."""
    with contextlib.ExitStack() as undo:
        for server in servers:
            undo.callback(server.stop)
            server.start()
        undo.pop_all()


class Launcher:
    """Starts the planned pairs one after another; registered as a pytest plugin for the session."""

    def __init__(self, plan: Sequence[PairSpec], mktemp: Callable[[str], Path]) -> None:
        self._pending = deque(plan)
        self._mktemp = mktemp
        self._starting: Started | None = None
        self._unadopted: dict[str, Started] = {}
        self._last_poll = 0.0
        atexit.register(self.stop_unadopted)

    def advance(self) -> None:
        """Start the next pending pair once none is starting."""
        if self._starting is not None and not self._starting.settled():
            return
        self._starting = None
        while self._pending and self._starting is None:
            spec = self._pending.popleft()
            try:
                install = locate(spec.sizes)
            except VllmSetupMissing:
                continue  # its fixture skips, or fails under LANE_ROUTER_REQUIRE_VLLM=1
            pair = Started(spec.build(install, self._mktemp(f"vllm-{spec.fixture}")), time.monotonic())
            start_all(pair.servers)
            self._unadopted[spec.fixture] = self._starting = pair

    def adopt(self, fixture: str) -> Started | None:
        """The pair started for `fixture`, now the fixture's to stop; None if it was not started
        (then it is taken off the plan: the fixture starts it)."""
        self._pending = deque(s for s in self._pending if s.fixture != fixture)
        return self._unadopted.pop(fixture, None)

    def stop_unadopted(self) -> None:
        while self._unadopted:
            _, pair = self._unadopted.popitem()
            for server in pair.servers:
                server.stop()

    @pytest.hookimpl
    def pytest_runtest_logfinish(self) -> None:
        now = time.monotonic()
        if self._pending and now - self._last_poll >= POLL_EVERY_S:
            self._last_poll = now
            self.advance()

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        self._pending.clear()
        self.stop_unadopted()


LAUNCHER = pytest.StashKey[Launcher]()
PLUGIN_NAME = "lane-router-realvllm-launcher"


def plan_for(uses: Sequence[Sequence[str]], specs: Sequence[PairSpec]) -> list[PairSpec]:
    """The pairs used by the tests whose fixture names are `uses` (in run order), in the order
    their first user runs."""
    first: dict[str, int] = {}
    for index, names in enumerate(uses):
        for spec in specs:
            if spec.fixture in names:
                first.setdefault(spec.fixture, index)
    return sorted((s for s in specs if s.fixture in first), key=lambda s: first[s.fixture])


def launch(session: pytest.Session, specs: Sequence[PairSpec]) -> None:
    """Start the pairs the collected tests use (nothing when they use none)."""
    plan = plan_for([getattr(item, "fixturenames", ()) for item in session.items], specs)
    if not plan or session.config.option.collectonly:
        return
    factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    launcher = Launcher(plan, factory.mktemp)
    session.config.stash[LAUNCHER] = launcher
    session.config.pluginmanager.register(launcher, PLUGIN_NAME)
    launcher.advance()


@contextlib.contextmanager
def serving(
    config: pytest.Config, fixture: str, make: Callable[[], Sequence[VllmServer]], timeout: float, label: str
) -> Iterator[tuple[Sequence[VllmServer], float]]:
    """The fixture's pair, healthy: adopted from the launcher or started here; stopped on exit.
    Yields the servers and the seconds from their start until this saw them all healthy."""
    launcher = config.stash.get(LAUNCHER, None)
    adopted = launcher.adopt(fixture) if launcher is not None else None
    pair = adopted or Started(make(), time.monotonic())
    with contextlib.ExitStack() as stack:
        for server in pair.servers:
            stack.callback(server.stop)
            if adopted is None:
                server.start()
        waited = time.monotonic()
        for server in pair.servers:
            server.wait_healthy(timeout)
        now = time.monotonic()
        # Shown with -s and in CI logs: the start-up is what a pair adds to a run.
        took, wait = now - pair.began, now - waited
        print(f"\nreal vLLM, {label}: {len(pair.servers)} servers healthy {took:.0f}s after start, "
              f"{wait:.0f}s waited here", file=sys.stderr)  # fmt: skip
        if launcher is not None:
            launcher.advance()
        yield pair.servers, took
