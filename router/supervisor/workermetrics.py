"""Metrics of `lane-router serve --workers N` (router/supervisor/workers.py).

Every worker keeps its own registry, as a lone router does; a scrape of `GET /metrics` through
the shared port — whichever worker the kernel hands it to — answers for all of them, every
sample labelled `worker="<i>"`, so a sum over `worker` is the router's total and one scrape
target stays one target. Each worker serves its own exposition on a Unix socket in the workers'
private directory (the parent's, mode 0700); the worker that answers the scrape (once
router/app/app.py has checked the key) reads every other worker's and merges the families. A worker
that does not answer within PEER_TIMEOUT_S is missing from that one scrape, and logged.

Prometheus's multiprocess mode was the other way: it writes every observation to a memory-mapped
file, which the relay would pay per streamed chunk, and it changes the client library's value
class for the whole process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from router.app.asgi import Message, Receive, Scope, Send
from router.observe.metrics import Metrics

log = logging.getLogger("lane_router.workers")

PEER_TIMEOUT_S = 2.0
_METRICS_PATH = b"/metrics"


def socket_path(run_dir: Path, index: int) -> Path:
    return run_dir / f"metrics-{index}.sock"


class WorkerMetrics(Metrics):
    """A worker's registry, exposed with its `worker` label."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = str(worker)

    def exposition(self) -> bytes:
        return generate_latest(_Labeled(self.registry.collect(), self.worker))


class _Labeled:
    def __init__(self, families: Iterable[Metric], worker: str) -> None:
        self._families = families
        self._worker = worker

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                s._replace(labels={**s.labels, "worker": self._worker}) for s in family.samples
            ]
            yield labelled


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(expositions: Iterable[bytes]) -> bytes:
    """One exposition of every sample of `expositions` (each already labelled by its worker)."""
    families: dict[str, Metric] = {}
    for text in expositions:
        for family in text_string_to_metric_families(text.decode()):
            found = families.get(family.name)
            if found is None:
                families[family.name] = family
            else:
                found.samples.extend(family.samples)
    return generate_latest(_Families(families.values()))


class MetricsPeers:
    """This worker's exposition served to the others, and theirs gathered for a scrape."""

    def __init__(self, metrics: Metrics, run_dir: Path, index: int, workers: int) -> None:
        self._metrics = metrics
        self._run_dir = run_dir
        self._index = index
        self._workers = workers
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = socket_path(self._run_dir, self._index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by this worker's predecessor
        self._server = await asyncio.start_unix_server(self._answer, path=str(path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(self._metrics.exposition())
            await writer.drain()
        finally:
            writer.close()

    async def merged(self, own: bytes) -> bytes:
        others = [i for i in range(self._workers) if i != self._index]
        texts = await asyncio.gather(*(self._read(i) for i in others))
        return merge([own, *(t for t in texts if t is not None)])

    async def _read(self, index: int) -> bytes | None:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(socket_path(self._run_dir, index)))
                return await reader.read()
        except (OSError, TimeoutError) as err:
            log.warning("metrics of worker %d left out of this scrape: %s", index, err or type(err).__name__)
            return None
        finally:
            if writer is not None:
                writer.close()


class MetricsApp:
    """The router's app, with `GET /metrics` answered for every worker."""

    def __init__(self, app: Any, peers: MetricsPeers) -> None:
        self.app = app
        self._peers = peers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("raw_path") or scope.get("path", "").encode()
        if scope["type"] != "http" or path != _METRICS_PATH or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        answered: list[Message] = []

        async def keep(message: Message) -> None:
            answered.append(message)

        await self.app(scope, receive, keep)
        start, rest = answered[0], answered[1:]
        if start["status"] != 200:
            for message in answered:
                await send(message)
            return
        body = await self._peers.merged(b"".join(m.get("body", b"") for m in rest))
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})
