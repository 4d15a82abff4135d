"""The lab's clients: a streaming client that times every read, and a deliberately slow reader.

Times are client-side: TTFT is the first body byte carrying a token, each inter-token gap is
the time between reads that carry tokens (several events in one read count as one gap), and the
final usage event (stream_options.include_usage) says how many tokens the answer had.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from dataclasses import dataclass, field

import httptools

from router.proxy.upstream import UpstreamPool

_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_CONTENT = b'"content":"'
_TEXT = re.compile(rb'"content":"((?:[^"\\]|\\.)*)"')


@dataclass
class Result:
    tag: str
    request_id: str
    started: float
    status: int = 0
    first: float | None = None
    ended: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens_reported: int | None = None
    content_events: int = 0
    done_marker: bool = False
    body_bytes: int = 0
    text_chars: int = 0  # characters of generated text received (slow reader: whole body parsed)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ended is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.started


def _note(result: Result, chunk: bytes, now: float, last: float | None) -> float | None:
    """Account one read of a streamed body; returns the time of the last token-carrying read."""
    result.body_bytes += len(chunk)
    events = chunk.count(_CONTENT)
    if events:
        result.content_events += events
        if result.first is None:
            result.first = now
        elif last is not None:
            result.gaps.append(now - last)
        last = now
    if b'"usage":{' in chunk:
        found = _USAGE.search(chunk[chunk.rfind(b'"usage":{') :])
        if found:
            result.tokens_reported = int(found.group(1))
    if b"data: [DONE]" in chunk:
        result.done_marker = True
    return last


async def stream(
    pool: UpstreamPool, body: bytes, headers: list[tuple[bytes, bytes]], tag: str, request_id: str
) -> Result:
    result = Result(tag, request_id, time.monotonic())
    hdrs = [*headers, (b"x-request-id", request_id.encode())]
    try:
        resp = await pool.request(b"POST", b"/v1/chat/completions", hdrs, body)
    except Exception:
        return result
    result.status = resp.status
    last: float | None = None
    try:
        async for chunk in resp:
            last = _note(result, chunk, time.monotonic(), last)
        result.ended = time.monotonic()
    except Exception:
        pass
    finally:
        await resp.aclose()
    return result


class _Parser:
    def __init__(self) -> None:
        self.status = 0
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


async def slow_stream(
    url: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    tag: str,
    request_id: str,
    bytes_per_s: float,
    read_size: int = 1024,
) -> Result:
    """A client with a small receive buffer that reads `read_size` bytes at `bytes_per_s`."""
    host, port = url.removeprefix("http://").split(":")
    result = Result(tag, request_id, time.monotonic())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    head = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"host: " + host.encode(),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"x-request-id: " + request_id.encode(),
    ]
    head += [k + b": " + v for k, v in headers]
    await loop.sock_sendall(sock, b"\r\n".join(head) + b"\r\n\r\n" + body)
    parser_state = _Parser()
    parser = httptools.HttpResponseParser(parser_state)
    pause = read_size / bytes_per_s
    last: float | None = None
    received: list[bytes] = []
    try:
        while not parser_state.complete:
            await asyncio.sleep(pause)
            data = await loop.sock_recv(sock, read_size)
            if not data:
                break
            parser.feed_data(data)
            result.status = parser.get_status_code()
            if parser_state.body:
                chunk = b"".join(parser_state.body)
                parser_state.body.clear()
                received.append(chunk)
                last = _note(result, chunk, time.monotonic(), last)
        if parser_state.complete:
            result.ended = time.monotonic()
    finally:
        sock.close()
    whole = b"".join(received)
    # Counted over the whole body: an event split across two reads is counted once.
    result.text_chars = sum(len(m) for m in _TEXT.findall(whole))
    found = _USAGE.search(whole[whole.rfind(b'"usage":{') :]) if b'"usage":{' in whole else None
    result.tokens_reported = int(found.group(1)) if found else None
    result.done_marker = whole.endswith(b"data: [DONE]\n\n")
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
