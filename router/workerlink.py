"""A worker's side of `lane-router serve --workers N` (router/workers.py): its channel to the
supervising parent, and the reload that reaches every worker.

The channel is one end of a socket pair. The worker writes on it to ask the parent to reload
the other workers; the parent never writes, so the only thing the worker ever reads is the end
of the file — the parent is gone — and then it stops itself as on SIGTERM, finishing its
requests within its grace period."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from router.metrics import Metrics
from router.runtime import Runtime
from router.settings import Settings
from router.slots.budget import Share
from router.state import ReloadOutcome, RouterState
from router.workermetrics import MetricsPeers, WorkerMetrics
from router.workers import RELOAD_MESSAGE

log = logging.getLogger("lane_router.workers")

# Reload triggers every worker sees by itself: its own SIGHUP (forwarded by the parent to all)
# and the change of the profile file (each worker watches it).
SIGHUP_TRIGGER = "SIGHUP"
FILE_TRIGGER = "file change"
EVERY_WORKER_SEES = frozenset({SIGHUP_TRIGGER, FILE_TRIGGER})


class WorkerLink:
    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Watch for the parent's end (needs the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._readable)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop = None

    def _readable(self) -> None:
        try:
            data = self._sock.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            log.warning("the supervising parent is gone: stopping")
            self.stop()
            os.kill(os.getpid(), signal.SIGTERM)

    def reload_others(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.send(RELOAD_MESSAGE)


class WorkerState(RouterState):
    """A worker's `RouterState`: a reload that only this worker saw (`POST /admin/reload`)
    reaches the others through the parent once it succeeded here."""

    def __init__(
        self,
        runtime: Runtime,
        metrics: Metrics,
        config_path: Path | None,
        *,
        bind_host: str,
        link: WorkerLink,
    ) -> None:
        super().__init__(runtime, metrics, config_path, bind_host=bind_host)
        self.link = link

    async def reload(self, trigger: str) -> ReloadOutcome:
        outcome = await super().reload(trigger)
        if outcome.ok and trigger not in EVERY_WORKER_SEES:
            self.link.reload_others()
        return outcome


@dataclass(frozen=True, slots=True)
class WorkerSide:
    """What a worker has that a lone router has not: its place among the workers, its channel
    to the parent, and its labelled metrics served to the others."""

    share: Share
    link: WorkerLink
    metrics: WorkerMetrics
    peers: MetricsPeers

    @classmethod
    def of(cls, settings: Settings) -> WorkerSide:
        index, fd, run_dir = settings.worker_index, settings.worker_channel_fd, settings.run_dir
        if index is None or fd is None or run_dir is None:
            raise ValueError("a worker needs its index, its channel and the run directory from its parent")
        metrics = WorkerMetrics(index)
        peers = MetricsPeers(metrics, run_dir, index, settings.workers)
        return cls(Share(settings.workers, index), WorkerLink(fd), metrics, peers)

    async def start(self) -> None:
        self.link.start()
        await self.peers.start()

    async def stop(self) -> None:
        self.link.stop()
        await self.peers.stop()
