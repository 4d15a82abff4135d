"""The JSON access log: a real `lane-router serve --access-log FILE` process, requests of every
kind (streamed, whole, refused, abandoned by their client), and the lines read back; and what the
writer does when its reader falls behind."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from router.observe.accesslog import AccessLog
from router.observe.record import RequestRecord
from tests.support.fakebackend import FakeBackend
from tests.support.profiles import KEYS, MODEL, UPSTREAM_KEY, auth, profile
from tests.support.scaleout import router, write_profile
from tests.support.servers import server_group

PROMPT = "a confidential prompt about otters"
FIELDS = [
    "time", "request_id", "key", "route", "class", "reason", "lane", "pool", "backend", "stream",
    "status", "error", "retries", "queue_ms", "upstream_ms", "ttft_ms", "duration_ms", "prompt_tokens",
    "completion_tokens", "bytes_in", "bytes_out", "client_disconnect", "trace_id", "slo",
]  # fmt: skip


def body(stream: bool, **extra: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 3,
        "stream": stream,
        **extra,
    }
    if stream:
        request["stream_options"] = {"include_usage": True}
    return request


@pytest.fixture
async def backend() -> AsyncIterator[tuple[FakeBackend, str]]:
    fake = FakeBackend()
    fake.behaviour.honor_max_tokens = True
    async with server_group() as group:
        yield fake, await group.start(fake)


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


async def lines(path: Path, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The log's lines once it holds `count` (the writer thread appends them a moment later)."""
    async with asyncio.timeout(timeout):
        while True:
            text = await asyncio.to_thread(_read, path)
            found = [orjson.loads(line) for line in text.splitlines()]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.05)


async def abandon_stream(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    """Read a stream's first event, then hang up while the backend is still generating."""
    request = body(True, max_tokens=50)
    async with http.stream(
        "POST", "/v1/chat/completions", json=request, headers={**auth("user"), "x-request-id": "gone-1"}
    ) as answer:
        async for _ in answer.aiter_bytes():
            break
    await fake.wait_for(lambda: fake.seen[-1].disconnected is not None, timeout=10)


async def abandon_before_answer(url: str, fake: FakeBackend) -> None:
    """Give up on a whole answer before the backend has produced anything."""
    headers = {**auth("user"), "x-request-id": "gone-2"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        sending = asyncio.ensure_future(http.post("/v1/chat/completions", json=body(False), headers=headers))
        await fake.wait_for(lambda: fake.seen[-1].headers["x-request-id"] == "user:gone-2", timeout=10)
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
    await fake.wait_for(lambda: fake.seen[-1].disconnected is not None, timeout=10)


async def test_one_line_per_request_with_its_route_timings_usage_and_outcome(
    tmp_path: Path, backend: tuple[FakeBackend, str]
) -> None:
    fake, url = backend
    log = tmp_path / "access.log"
    config = write_profile(tmp_path / "p.yaml", profile([url]))
    async with router(config, args=["--access-log", str(log)]) as r:
        async with httpx.AsyncClient(base_url=r.url, timeout=30) as http:
            path = "/v1/chat/completions"
            streamed = await http.post(path, json=body(True), headers={**auth("user"), "x-request-id": "s-1"})
            whole = await http.post(path, json=body(False), headers={**auth("user"), "x-request-id": "w-1"})
            refused = await http.post(path, json=body(False), headers={"authorization": "Bearer nope"})
            unknown = await http.post(path, json=body(False, model="no-such-model"), headers=auth("user"))
            fake.behaviour.itl_s = 0.2
            await abandon_stream(http, fake)
            fake.behaviour.ttft_s = 30.0
            await abandon_before_answer(r.url, fake)
        statuses = [streamed.status_code, whole.status_code, refused.status_code, unknown.status_code]
        assert statuses == [200, 200, 401, 404]
        found = await lines(log, 6)
    assert len(found) == 6 and all(list(line) == FIELDS for line in found)
    s, w, x, u, gone, early = found

    assert (s["request_id"], s["key"], s["route"], s["status"], s["stream"]) == (
        "s-1", "user", "/v1/chat/completions", 200, True,
    )  # fmt: skip
    assert (s["class"], s["reason"], s["lane"], s["pool"], s["backend"], s["retries"]) == (
        "chat", "default", "chat", "interactive", 0, 0,
    )  # fmt: skip
    assert (s["prompt_tokens"], s["completion_tokens"]) == (1, 3)
    assert s["bytes_in"] == len(orjson.dumps(body(True))) and s["bytes_out"] == len(streamed.content)
    assert 0 <= s["queue_ms"] <= s["ttft_ms"] <= s["duration_ms"]
    assert s["client_disconnect"] is False and s["error"] is None and s["trace_id"] is None
    assert s["time"].endswith("Z") and s["time"][:4].isdigit()

    assert (w["request_id"], w["stream"], w["status"], w["prompt_tokens"], w["completion_tokens"]) == (
        "w-1", False, 200, 1, 3,
    )  # fmt: skip
    assert w["bytes_out"] == len(whole.content)

    # Refused before any key matched: no key name, no class, no backend, no timings past the end.
    assert (x["status"], x["error"], x["key"], x["class"], x["backend"]) == (
        401,
        "invalid_api_key",
        None,
        None,
        None,
    )
    assert x["ttft_ms"] is None and x["queue_ms"] is None and x["duration_ms"] is not None
    assert (u["status"], u["error"], u["key"], u["backend"]) == (404, "model_not_found", "user", None)

    assert (gone["request_id"], gone["status"], gone["client_disconnect"]) == ("gone-1", 200, True)
    assert gone["ttft_ms"] is not None and gone["bytes_out"] > 0
    assert gone["completion_tokens"] is None  # the stream never reached its usage report

    assert (early["request_id"], early["status"], early["client_disconnect"]) == ("gone-2", 499, True)
    assert early["ttft_ms"] is None and early["bytes_out"] == 0 and early["backend"] == 0

    text = log.read_bytes()
    for secret in (KEYS["user"], "nope", UPSTREAM_KEY, PROMPT, "otters"):
        assert secret.encode() not in text


def record(i: int) -> RequestRecord:
    rec = RequestRecord(b"r-%d" % i, "/v1/completions", time.time(), time.monotonic())
    rec.end(200)
    return rec


def test_a_full_queue_drops_lines_counts_them_and_says_so_in_the_log(tmp_path: Path) -> None:
    """The log is a pipe nobody reads at first: the writer blocks once the pipe is full, the queue
    fills, and further lines are dropped without blocking the caller. Once the reader drains
    the pipe, the next line is preceded by the count of those dropped."""
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    access = AccessLog(str(fifo), queue_lines=8)
    sent = 2000
    began = time.monotonic()
    for i in range(sent):
        access.write(record(i))
    assert time.monotonic() - began < 5.0  # the caller was never held by the blocked writer

    received = bytearray()
    done = threading.Event()

    def drain() -> None:
        os.set_blocking(reader, True)
        while chunk := os.read(reader, 65536):
            received.extend(chunk)
        done.set()

    thread = threading.Thread(target=drain)
    thread.start()
    access.write(record(sent))
    access.close()
    assert done.wait(10)
    thread.join()
    os.close(reader)

    parsed = [orjson.loads(line) for line in bytes(received).splitlines()]
    dropped = [line["count"] for line in parsed if line.get("event") == "access_log_dropped"]
    written = [line for line in parsed if "request_id" in line]
    assert dropped and sum(dropped) + len(written) == sent + 1
    # A count comes before the next line that got through; the last record may itself have met a
    # queue still full, and then the count written at close ends the file.
    for before, after in itertools.pairwise(parsed):
        if before.get("event") == "access_log_dropped":
            assert "request_id" in after
    last = parsed[-1]
    assert last.get("request_id") == f"r-{sent}" or last.get("event") == "access_log_dropped"


async def test_workers_share_one_log_file_line_by_line(
    tmp_path: Path, backend: tuple[FakeBackend, str]
) -> None:
    _, url = backend
    log = tmp_path / "access.log"
    config = write_profile(tmp_path / "p.yaml", profile([url]))
    async with router(config, workers=2, args=["--access-log", str(log)]) as r, r.client() as http:
        answers = await asyncio.gather(
            *(
                http.post(
                    "/v1/chat/completions",
                    json=body(i % 2 == 0),
                    headers={**auth("user"), "x-request-id": f"k-{i}"},
                )
                for i in range(12)
            )
        )
        assert all(a.status_code == 200 for a in answers)
        found = await lines(log, 12)
    assert sorted(line["request_id"] for line in found) == sorted(f"k-{i}" for i in range(12))
