"""`lane-router serve --workers N`: a supervising parent and N worker processes on one port.

Each worker is a whole router — its own event loop, runtime, health checker, file watcher and
metrics — started as `python -m router serve` with its number, N and its end of a channel to
the parent in its environment (router/settings.py). The port is shared one of two ways
(`LANE_ROUTER_WORKER_SOCKETS`):

- `reuseport` (the default): the parent binds the port with SO_REUSEPORT and never listens on
  it, which holds the port (and picks it, for port 0); each worker binds its own SO_REUSEPORT
  socket and listens, and the kernel spreads connections over the workers;
- `inherit`: the parent binds and listens; every worker accepts on that one socket.

docs/performance.md ("Workers") has the measurement that chose the default.

The parent starts the workers and restarts one that exits while it is not stopping, after a
backoff (RESTART_MIN_S, doubling to RESTART_MAX_S; reset once a worker has run STABLE_S), with
a log line saying how it ended. A reload goes one way to every worker, whether SIGHUP reached the
parent or a worker asked for it (`POST /admin/reload`, over its channel): the parent asks each
worker over its channel to re-read its files as on SIGHUP (its profile and its TLS files), and
waits for each one's report (router/supervisor/workerchannel.py); a worker that asked gets them all, to
answer its request with. SIGTERM or SIGINT is forwarded to every worker as SIGTERM — each stops
accepting and finishes its requests within its grace period — and the parent exits once they all
have; a second one is forwarded too (it ends the workers' grace at once), and a worker still
running KILL_AFTER_S after its grace is killed. Workers run in their own session, so a
terminal's ^C reaches them once, through the parent; a worker whose parent is gone (its channel
closes) stops itself."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.httpserver.server import FLUSH_S, UNWIND_S
from router.settings import Settings
from router.supervisor.workerchannel import (
    ANSWER,
    ASK,
    RELOAD,
    RELOADED,
    REPORT_WAIT_S,
    ChannelError,
    Lines,
    message,
)

log = logging.getLogger("lane_router.workers")

RESTART_MIN_S = 0.5
RESTART_MAX_S = 30.0
STABLE_S = 30.0
KILL_AFTER_S = 5.0


@dataclass(eq=False)
class _Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    channel: socket.socket | None = None
    started: float = 0.0
    failures: int = 0


def listener(settings: Settings) -> socket.socket:
    """The parent's socket on the port: bound (and listening, to be inherited) or, with
    reuseport, only bound, holding the port for the workers' own sockets."""
    sock = bind(settings.host, settings.port, reuse_port=settings.worker_sockets == "reuseport")
    if settings.worker_sockets == "inherit":
        sock.listen(2048)
    return sock


def bind(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def restart_delay(failures: int) -> float:
    """How long to wait before the `failures`-th restart in a row."""
    return float(min(RESTART_MAX_S, RESTART_MIN_S * 2 ** max(0, failures - 1)))


class Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket, run_dir: Path) -> None:
        self._settings = settings
        self._sock = sock
        self._port: int = sock.getsockname()[1]
        self._run_dir = run_dir
        self._workers = [_Worker(i) for i in range(settings.workers)]
        self._stopping = asyncio.Event()
        self._reloads = itertools.count(1)
        # A report each reload awaits, by worker and reload number.
        self._reports: dict[tuple[int, int], asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        log.info(
            "supervising %d workers on %s:%d (%s sockets)",
            len(self._workers),
            self._settings.host,
            self._port,
            self._settings.worker_sockets,
        )
        keepers = [loop.create_task(self._keep(w)) for w in self._workers]
        try:
            await self._stopping.wait()
            grace = self._settings.graceful_shutdown_s + UNWIND_S + FLUSH_S + KILL_AFTER_S
            await asyncio.wait(keepers, timeout=grace)
            for w in self._workers:
                if w.proc is not None and w.proc.returncode is None:
                    log.warning("worker %d still running after its grace: killing it", w.index)
                    w.proc.kill()
            await asyncio.gather(*keepers, return_exceptions=True)
        finally:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        log.info("all workers stopped")
        return 0

    def _stop(self) -> None:
        if self._stopping.is_set():
            log.info("second stop signal: the workers end their grace period now")
        else:
            log.info("stopping: each worker finishes its requests within its grace period")
            self._stopping.set()
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, sig: int) -> None:
        for w in self._workers:
            if w.proc is not None and w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(sig)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_sighup(self) -> None:
        self._spawn(self.reload_workers("SIGHUP"))

    async def reload_workers(self, trigger: str) -> list[dict[str, Any]]:
        """Ask every worker to re-read its files as on SIGHUP; each one's report, in order of
        their numbers (router/state/live.py `ReloadReport.to_json`), once all have answered or
        REPORT_WAIT_S has passed."""
        number = next(self._reloads)
        reports = await asyncio.gather(*(self._reload_one(w, number, trigger) for w in self._workers))
        failed = [r for r in reports if r["result"] != "reloaded"]
        said = "; ".join(f"worker {r['worker']} {r['result']}" for r in reports)
        if failed:
            log.warning("reload (%s): %s (%s)", trigger, said, "; ".join(r["reason"] for r in failed))
        else:
            log.info("reload (%s): %s", trigger, said)
        return list(reports)

    async def _reload_one(self, worker: _Worker, number: int, trigger: str) -> dict[str, Any]:
        channel = worker.channel
        if channel is None or worker.proc is None or worker.proc.returncode is not None:
            return _missing(worker, "not running: it reads the files as it starts")
        key = (worker.index, number)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._reports[key] = answer
        try:
            await asyncio.get_running_loop().sock_sendall(channel, message(RELOAD, number, trigger))
            async with asyncio.timeout(REPORT_WAIT_S):
                return await answer
        except OSError:
            return _missing(worker, "its channel is closed")
        except TimeoutError:
            return _missing(worker, f"no report within {REPORT_WAIT_S:.0f} s")
        finally:
            self._reports.pop(key, None)

    async def _keep(self, worker: _Worker) -> None:
        """Run one worker until the parent stops, restarting it when it exits meanwhile."""
        while not self._stopping.is_set():
            await self._start(worker)
            assert worker.proc is not None
            listening = asyncio.ensure_future(self._listen(worker))
            try:
                code = await worker.proc.wait()
            finally:
                listening.cancel()
                if worker.channel is not None:
                    worker.channel.close()
                    worker.channel = None
                self._gone(worker)
            if self._stopping.is_set():
                return
            ran = time.monotonic() - worker.started
            worker.failures = 1 if ran >= STABLE_S else worker.failures + 1
            delay = restart_delay(worker.failures)
            log.warning(
                "worker %d (pid %d) %s after %.1f s; restarting it in %.1f s",
                worker.index,
                worker.proc.pid,
                _ending(code),
                ran,
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _start(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        fds = [theirs.fileno()]
        env = {**os.environ, **self._environment(worker.index, theirs.fileno())}
        if self._settings.worker_sockets == "inherit":
            fds.append(self._sock.fileno())
            env["LANE_ROUTER_LISTEN_FD"] = str(self._sock.fileno())
        try:
            worker.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "router", "serve", env=env, pass_fds=fds, start_new_session=True
            )
        finally:
            theirs.close()
        worker.channel = ours
        worker.started = time.monotonic()
        log.info("worker %d started (pid %d)", worker.index, worker.proc.pid)

    def _environment(self, index: int, channel_fd: int) -> dict[str, str]:
        s = self._settings
        env = {
            "LANE_ROUTER_HOST": s.host,
            "LANE_ROUTER_PORT": str(self._port),
            "LANE_ROUTER_LOG_LEVEL": s.log_level,
            "LANE_ROUTER_WORKERS": str(s.workers),
            "LANE_ROUTER_WORKER_SOCKETS": s.worker_sockets,
            "LANE_ROUTER_WORKER_INDEX": str(index),
            "LANE_ROUTER_WORKER_CHANNEL_FD": str(channel_fd),
            "LANE_ROUTER_RUN_DIR": str(self._run_dir),
        }
        if s.config is not None:
            env["LANE_ROUTER_CONFIG"] = str(s.config.resolve())
        for name, path in (("CERT", s.tls_cert), ("KEY", s.tls_key), ("CLIENT_CA", s.tls_client_ca)):
            if path is not None:
                env[f"LANE_ROUTER_TLS_{name}"] = str(path.resolve())
        if s.access_log_file is not None:
            # Every worker appends whole lines to the one file, each batch in one write(2).
            env["LANE_ROUTER_ACCESS_LOG_FILE"] = s.access_log_file
        return env

    def _gone(self, worker: _Worker) -> None:
        """`worker` has exited: the reloads waiting for its report hear so now."""
        for (index, _), answer in list(self._reports.items()):
            if index == worker.index and not answer.done():
                answer.set_result(_missing(worker, "exited"))

    async def _listen(self, worker: _Worker) -> None:
        """Messages of one worker over its channel, until it closes."""
        channel = worker.channel
        assert channel is not None
        loop = asyncio.get_running_loop()
        lines = Lines()
        try:
            while data := await loop.sock_recv(channel, 65536):
                for kind, number, payload in lines.feed(data):
                    if kind == RELOADED and isinstance(payload, dict):
                        self._reported(worker, number, payload)
                    elif kind == ASK:
                        log.info("worker %d asks every worker to reload (%s)", worker.index, payload)
                        self._spawn(self._answer(worker, channel, number, str(payload)))
        except ChannelError as err:
            log.error("worker %d: its channel is broken, no longer read: %s", worker.index, err)

    def _reported(self, worker: _Worker, number: int, report: dict[str, Any]) -> None:
        answer = self._reports.get((worker.index, number))
        if answer is not None and not answer.done():
            answer.set_result({**report, "worker": worker.index})

    async def _answer(self, worker: _Worker, channel: socket.socket, number: int, trigger: str) -> None:
        reports = await self.reload_workers(f"{trigger} on worker {worker.index}")
        if worker.channel is channel:  # not restarted meanwhile: it still waits
            with contextlib.suppress(OSError):
                await asyncio.get_running_loop().sock_sendall(channel, message(ANSWER, number, reports))


def _missing(worker: _Worker, reason: str) -> dict[str, Any]:
    """The report of a worker that made none."""
    return {"worker": worker.index, "result": "no_answer", "reason": f"worker {worker.index} {reason}"}


def _ending(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def supervise(settings: Settings) -> int:
    """Run `settings.workers` workers on the port until SIGTERM or SIGINT."""
    sock = listener(settings)
    try:
        with tempfile.TemporaryDirectory(prefix="lane-router-") as run_dir:
            return asyncio.run(Supervisor(settings, sock, Path(run_dir)).run())
    finally:
        sock.close()
