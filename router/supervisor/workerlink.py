"""A worker's side of `lane-router serve --workers N` (router/supervisor/workers.py): its channel to the
supervising parent (router/supervisor/workerchannel.py), and the reload that reaches every worker.

Over the channel the parent asks the worker to re-read its files (its profile and TLS files, as
SIGHUP does) and the worker reports what it did; the worker asks the parent to reload every
worker, itself included, when `POST /admin/reload` reached it, and hears back every worker's
report. The end of the file means the parent is gone: the worker stops itself as on SIGTERM,
finishing its requests within its grace period."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.observe.metrics import Metrics
from router.settings import Settings
from router.state.live import ReloadReport, RouterState
from router.state.runtime import Runtime
from router.state.slots.budget import Share
from router.supervisor.workerchannel import (
    ANSWER,
    ANSWER_WAIT_S,
    ASK,
    RELOAD,
    RELOADED,
    ChannelError,
    Lines,
    message,
)
from router.supervisor.workermetrics import MetricsPeers, WorkerMetrics
from router.tls.serving import ServingTls

log = logging.getLogger("lane_router.workers")

# Reload triggers every worker sees by itself: its own SIGHUP and the change of the profile file
# (each worker watches it).
SIGHUP_TRIGGER = "SIGHUP"
FILE_TRIGGER = "file change"

Reload = Callable[[str], Awaitable[ReloadReport]]


class WorkerLink:
    def __init__(self, fd: int, index: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(False)
        self._index = index
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reload: Reload | None = None
        self._lines = Lines()
        self._asks = itertools.count(1)
        # The parent's answers awaited, by request; None: the link stopped first.
        self._answers: dict[int, asyncio.Future[list[dict[str, Any]] | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, reload: Reload) -> None:
        """Serve the parent's messages with `reload` (needs the running loop)."""
        self._reload = reload
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._readable)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop = None
        for task in self._tasks:
            task.cancel()
        for answer in self._answers.values():
            if not answer.done():
                answer.set_result(None)

    def _readable(self) -> None:
        try:
            data = self._sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            log.warning("the supervising parent is gone: stopping")
            self.stop()
            os.kill(os.getpid(), signal.SIGTERM)
            return
        try:
            for kind, number, payload in self._lines.feed(data):
                if kind == RELOAD:
                    self._spawn(self._reload_files(number, str(payload)))
                elif kind == ANSWER and isinstance(payload, list):
                    answer = self._answers.get(number)
                    if answer is not None and not answer.done():
                        answer.set_result(payload)
        except ChannelError as err:
            log.error("the channel to the supervising parent is broken: %s", err)
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())

    def _spawn(self, work: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload_files(self, number: int, trigger: str) -> None:
        assert self._reload is not None
        report = await self._reload(trigger)
        await self._send(message(RELOADED, number, report.to_json()))

    async def _send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: the end of the file says so
            await asyncio.get_running_loop().sock_sendall(self._sock, data)

    async def reload_everywhere(self, trigger: str) -> list[ReloadReport]:
        """Have the parent reload every worker's files, this one's included; their reports."""
        number = next(self._asks)
        answer: asyncio.Future[list[dict[str, Any]] | None] = asyncio.get_running_loop().create_future()
        self._answers[number] = answer
        try:
            await self._send(message(ASK, number, trigger))
            async with asyncio.timeout(ANSWER_WAIT_S):
                reports = await answer
        except TimeoutError:
            reports = None
        finally:
            self._answers.pop(number, None)
        if not reports:
            why = f"had no answer from the supervising parent within {ANSWER_WAIT_S:.0f} s"
            return [ReloadReport.missing(self._index, f"worker {self._index} {why}")]
        return [ReloadReport.from_json(report) for report in reports]


class WorkerState(RouterState):
    """A worker's `RouterState`: `POST /admin/reload` reloads every worker through the parent."""

    def __init__(
        self,
        runtime: Runtime,
        metrics: Metrics,
        config_path: Path | None,
        *,
        bind_host: str,
        link: WorkerLink,
        worker: int,
        tls: ServingTls | None = None,
    ) -> None:
        super().__init__(runtime, metrics, config_path, bind_host=bind_host, tls=tls)
        self.link = link
        self.worker = worker

    async def reload_everywhere(self, trigger: str) -> list[ReloadReport]:
        return await self.link.reload_everywhere(trigger)


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
        return cls(Share(settings.workers, index), WorkerLink(fd, index), metrics, peers)

    async def start(self, reload: Reload) -> None:
        self.link.start(reload)
        await self.peers.start()

    async def stop(self) -> None:
        self.link.stop()
        await self.peers.stop()
