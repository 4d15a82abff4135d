from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from router.app.asgi import answer_lifespan
from router.lab.bench.generate import Request
from router.lab.bench.loadclient import Endpoint, StreamMeter, new_outcome, send_slow
from tests.support.servers import running


def chunk(text: str, *, role: bool = False) -> bytes:
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"


def test_meter_times_text_events_split_anywhere() -> None:
    body = (
        chunk("", role=True)
        + chunk(" a")
        + chunk(" b")
        + b": keep-alive\n\n"
        + chunk(" c")
        + b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\n'
        + b"data: [DONE]\n\n"
    )
    meter = StreamMeter()
    # One byte at a time, one "second" apart: an event counts when its last byte arrives.
    ends = []
    for i in range(len(body)):
        if meter.feed(body[i : i + 1], float(i)):
            ends.append(i)
    assert meter.first == ends[0] and len(ends) == 3
    assert meter.gaps == [ends[1] - ends[0], ends[2] - ends[1]]
    assert meter.tokens == 3 and meter.done and meter.error is None


def test_meter_counts_pieces_without_usage_and_reports_errors() -> None:
    meter = StreamMeter()
    meter.feed(chunk(" x") + b'data: {"choices":[{"index":0,"text":" y"}]}\n\n', 1.0)
    assert meter.tokens == 2 and not meter.done
    meter.feed(b'data: {"error": {"message": "upstream went away"}}\n\n', 2.0)
    assert meter.error is not None and "upstream went away" in meter.error


class Firehose:
    """Streams `events` SSE events of one token and ~1 KiB as fast as the socket takes them."""

    def __init__(self, events: int) -> None:
        self.events = events
        self.finished_at: float | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        while (await receive()).get("more_body"):
            pass
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        # One token of text in about 1 KiB of event (padding the reader does not count).
        piece = (
            b"data: "
            + orjson.dumps({"choices": [{"index": 0, "delta": {"content": " abc"}}], "pad": "x" * 1000})
            + b"\n\n"
        )
        for _ in range(self.events):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        self.finished_at = time.monotonic()


def request(rate: float | None) -> Request:
    return Request(
        "slow_stream-000001",
        "slow_stream",
        0.0,
        {"model": "m", "messages": [], "stream": True},
        "c1",
        True,
        10,
        10,
        read_rate=rate,
    )


@pytest.mark.timeout(30)
async def test_a_slow_reader_holds_the_sender_back() -> None:
    events, rate = 2000, 1000.0  # 2 MB read at 1,000 pieces/s: about 2 s
    app = Firehose(events)
    async with running(app) as url:
        req = request(rate)
        out = new_outcome(req, 0.0)
        sent = time.monotonic()
        await send_slow(Endpoint(url, None), req, out, sent, timeout=20)
        read_all = time.monotonic() - sent
    assert out.ok and out.error is None, out.error
    assert out.output_tokens == events and len(out.gaps) == events - 1
    assert read_all >= (events - 1) / rate
    assert app.finished_at is not None
    # The server could not write ahead of the reader by more than the buffers on the way: it
    # finished well after the first half of the reading time.
    assert app.finished_at - sent > 0.5 * read_all
    assert sum(out.gaps) / len(out.gaps) >= 0.9 / rate


@pytest.mark.timeout(30)
async def test_a_fast_reader_on_the_same_socket_path_is_not_held() -> None:
    app = Firehose(2000)
    async with running(app) as url:
        req = request(1e9)
        out = new_outcome(req, 0.0)
        sent = time.monotonic()
        await send_slow(Endpoint(url, None), req, out, sent, timeout=20)
    assert out.ok and out.output_tokens == 2000
    assert out.e2e is not None and out.e2e < 1.5


async def test_connection_refused_is_an_outcome_not_an_exception() -> None:
    from tests.support.servers import free_port

    req = request(10.0)
    out = new_outcome(req, 0.0)
    await send_slow(Endpoint(f"http://127.0.0.1:{free_port()}", None), req, out, time.monotonic(), 5)
    assert out.status == 0 and out.error is not None and not out.ok
    await asyncio.sleep(0)
