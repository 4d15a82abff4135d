"""Several router processes in front of one recording backend, for the scale-out tests.

The backend streams every request (headers at once, the first token after `ttft_s`, one token
every `itl_s`, as many as the request's `max_tokens`) and keeps, at every instant it changes,
how many requests await their first byte, how many of those are long (a prompt above LONG_CHARS
characters), and how many it is serving: the peaks are what the routers together let through.
Routers run as `python -m router serve` processes (optionally `--workers N`) on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from router.app.asgi import Receive, Scope, Send, answer_lifespan, receive_body
from tests.support.processes import stop, wait_ready
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import free_port

LONG_CHARS = 2000  # a long prompt for the routers: its pool's long_prompt_tokens is LONG_TOKENS
LONG_TOKENS = 500
START_TIMEOUT_S = 60.0
_DOCUMENTS = itertools.count()


@dataclass
class Recording:
    awaiting: int = 0
    long_awaiting: int = 0
    serving: int = 0
    served: int = 0
    disconnected: int = 0
    peaks: dict[str, int] = field(default_factory=lambda: {"awaiting": 0, "long": 0, "serving": 0})
    log: list[tuple[int, int, int]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self) -> None:
        now = (self.awaiting, self.long_awaiting, self.serving)
        self.log.append(now)
        for name, value in zip(("awaiting", "long", "serving"), now, strict=True):
            self.peaks[name] = max(self.peaks[name], value)
        self.changed.set()
        self.changed = asyncio.Event()

    def reset_peaks(self) -> None:
        self.peaks = {"awaiting": 0, "long": 0, "serving": 0}

    async def until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                await self.changed.wait()


@dataclass
class RecordingBackend:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    recording: Recording = field(default_factory=Recording)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = await receive_body(receive)
        if scope["path"] != "/v1/chat/completions":
            await _json(send, {"status": "ok"} if scope["path"] == "/health" else {"data": []})
            return
        request = orjson.loads(body)
        streaming = asyncio.ensure_future(self._stream(request, send))
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            # Like vLLM, a request whose client went away is aborted.
            await asyncio.wait([streaming, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            streaming.cancel()
            await asyncio.gather(streaming, gone, return_exceptions=True)

    async def _stream(self, request: dict[str, Any], send: Send) -> None:
        long = sum(len(m.get("content", "")) for m in request["messages"]) > LONG_CHARS
        rec = self.recording
        rec.awaiting += 1
        rec.long_awaiting += long
        rec.serving += 1
        rec.note()
        first = serving = True
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            await asyncio.sleep(self.ttft_s)
            for i in range(int(request.get("max_tokens") or 4)):
                if not first:
                    await asyncio.sleep(self.itl_s)
                event = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}}], "model": MODEL}
                if first:
                    # Counted out before the byte leaves: the router sees it only afterwards.
                    first = False
                    rec.awaiting -= 1
                    rec.long_awaiting -= long
                    rec.note()
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + orjson.dumps(event) + b"\n\n",
                        "more_body": True,
                    }
                )
            serving = False
            rec.serving -= 1
            rec.served += 1
            rec.note()
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        except (asyncio.CancelledError, OSError):
            rec.disconnected += 1
            raise
        finally:
            if first:
                rec.awaiting -= 1
                rec.long_awaiting -= long
            if serving:
                rec.serving -= 1
            if first or serving:
                rec.note()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json(send: Send, payload: Any) -> None:
    body = orjson.dumps(payload)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})


def shaped(backend: str, **top: Any) -> dict[str, Any]:
    """One pool of one backend with partial-prefill admission; chat capped at 3 in flight, and
    every test request is chat."""
    data = profile([backend])
    pool = data["pools"]["interactive"]
    pool["admission"] = {"max_prefilling": 2, "max_long_prefilling": 1, "long_prompt_tokens": LONG_TOKENS}
    pool["read_timeout_s"] = 60
    data["lanes"]["chat"].update(max_in_flight=3, queue_timeout_s=60)
    data["health"] = {"interval_s": 0.5, "timeout_s": 2, "unhealthy_after": 5, "healthy_after": 1}
    data["classify"]["long_context_tokens"] = 100_000  # long prompts stay in the chat lane
    data.update(top)
    return data


def chat(long: bool = False, tokens: int = 4) -> dict[str, Any]:
    # Each long prompt its own document: a repeated one would be classified rag.
    content = f"{next(_DOCUMENTS)} " + "a long document " * (LONG_CHARS // 10) if long else "hi there"
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "stream": True,
    }


@dataclass
class Router:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def client(self) -> httpx.AsyncClient:
        # A connection per request, so `--workers` spreads them over the workers.
        limits = httpx.Limits(max_keepalive_connections=0)
        return httpx.AsyncClient(base_url=self.url, timeout=90, limits=limits)

    async def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        async with self.client() as http:
            text = (await http.get("/metrics", headers=auth("scraper"))).text
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    async def total(self, name: str, **labels: str) -> float:
        samples = (await self.metrics()).get(name, [])
        return sum(v for found, v in samples if all(found.get(k) == w for k, w in labels.items()))

    def workers(self) -> list[int]:
        """The pids of the worker processes of a `--workers` router."""
        return children(self.proc.pid)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return sorted(found)


@contextlib.asynccontextmanager
async def router(
    config: Path, workers: int | None = None, args: Sequence[str] = (), **env: str
) -> AsyncIterator[Router]:
    """`lane-router serve --config CONFIG [ARGS]` on a free port until the block ends (SIGTERM)."""
    port = free_port()
    log = config.with_name(f"router-{port}.log")
    argv = [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", str(port), *args]
    if workers is not None:
        argv += ["--workers", str(workers)]
    proc = _spawn(argv, {**os.environ, "LANE_ROUTER_GRACEFUL_SHUTDOWN_S": "5", **env}, log)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, START_TIMEOUT_S)
        yield Router(url, proc, log)
    finally:
        await asyncio.to_thread(stop, proc, 20.0)


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def until_exited(*pids: int, timeout: float = 30.0) -> None:
    """Until none of `pids` runs: its sockets are closed then. Polled, as no event says it."""
    async with asyncio.timeout(timeout):
        while any(alive(pid) for pid in pids):
            await asyncio.sleep(0.05)


async def every_worker_ready(r: Router, workers: int) -> None:
    """Until each worker reports its backend up (the scrape merges every worker's metrics)."""
    async with asyncio.timeout(START_TIMEOUT_S):
        while True:
            with contextlib.suppress(httpx.TransportError):
                ups = [
                    labels["worker"]
                    for labels, v in (await r.metrics()).get("lane_router_backend_up", [])
                    if v == 1
                ]
                if len(set(ups)) == workers:
                    return
            await asyncio.sleep(0.1)


def write_profile(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


async def burst(routers: list[Router], requests: list[dict[str, Any]]) -> list[int]:
    """The requests at once, spread over the routers in turn; their statuses, each read to its end."""
    clients = [r.client() for r in routers]

    async def one(i: int, body: dict[str, Any]) -> int:
        async with clients[i % len(clients)].stream(
            "POST", "/v1/chat/completions", json=body, headers=auth("user")
        ) as resp:
            await resp.aread()
            return resp.status_code

    try:
        return list(await asyncio.gather(*(one(i, b) for i, b in enumerate(requests))))
    finally:
        for c in clients:
            await c.aclose()


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
