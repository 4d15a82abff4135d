"""The harness's load client: one request in, one `Outcome` out — for the mixed-traffic lab, the
lane-policy experiments and the demo alike.

Ordinary clients use the project's pooled HTTP/1.1 client and read as fast as bytes come.
Slow readers are real slow readers: each opens its own socket with a small receive buffer and a
small user-space buffer, reads a few hundred bytes at a time and pauses after each read so that
it never takes more than its `read_rate` tokens (or `read_bytes_per_s` bytes) per second. The
sender sees a full TCP window, exactly as with a slow device.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import orjson

from router.errors import UpstreamError
from router.lab.bench.generate import Request
from router.lab.bench.outcome import Outcome
from router.proxy.http1 import parse_origin
from router.proxy.upstream import UpstreamPool
from router.request.tokens import estimate_text_tokens

CHAT_PATH = b"/v1/chat/completions"
SLOW_RCVBUF = 4096
SLOW_MSS = 1400
SLOW_READ_BYTES = 256
_DEBUG_HEADERS = {
    b"x-lane-router-lane": "lane",
    b"x-lane-router-class": "routed_class",
    b"x-lane-router-reason": "reason",
}


class StreamMeter:
    """Splits an SSE body into events and times the ones that carry generated text."""

    __slots__ = ("_buffer", "_last", "chars", "done", "error", "first", "gaps", "pieces", "usage_tokens")

    def __init__(self) -> None:
        self._buffer = b""
        self._last = 0.0
        self.first: float | None = None
        self.gaps: list[float] = []
        self.pieces = 0
        self.chars = 0
        self.usage_tokens: int | None = None
        self.error: str | None = None
        self.done = False

    def feed(self, data: bytes, now: float) -> int:
        """Take body bytes received at `now`; return the tokens of text that completed (by the
        project's 4-characters-a-token estimate: a server that fell behind sends several tokens
        in one event)."""
        self._buffer += data
        *events, self._buffer = self._buffer.split(b"\n\n")
        tokens = 0
        for event in events:
            text = self._event(event.strip())
            if text is None:
                continue
            tokens += max(1, estimate_text_tokens(text))
            if self.first is None:
                self.first = now
            else:
                self.gaps.append(now - self._last)
            self._last = now
        return tokens

    def _event(self, event: bytes) -> str | None:
        """The generated text an event carries, or None."""
        if not event.startswith(b"data:"):
            return None  # comments, keep-alives
        payload = event[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return None
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.error = "malformed SSE event"
            return None
        if not isinstance(data, dict):
            return None
        if "error" in data:
            self.error = str(data["error"])[:200]
            return None
        usage = data.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        for choice in data.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or choice.get("text")
            if text:
                self.pieces += 1
                self.chars += len(text)
                return str(text)
        return None

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.pieces


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    key: str | None

    def headers(self, req: Request) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json"), (b"x-request-id", req.wire_id.encode())]
        out += [(k.encode(), v.encode()) for k, v in req.headers]
        if self.key:
            out.append((b"authorization", b"Bearer " + self.key.encode()))
        return out


def new_outcome(req: Request, arrival: float) -> Outcome:
    return Outcome(
        request_id=req.request_id,
        cls=req.cls,
        arrival=arrival,
        stream=req.stream,
        client_id=req.client_id,
        prompt_tokens=req.prompt_tokens,
        max_tokens=req.output_tokens,
        session=req.session,
        step=req.step,
        tenant=req.tenant,
    )


def _note_headers(out: Outcome, headers: Sequence[tuple[bytes, bytes]]) -> None:
    for name, value in headers:
        attr = _DEBUG_HEADERS.get(name.lower())
        if attr is not None:
            setattr(out, attr, value.decode("latin-1"))


def _finish_stream(out: Outcome, meter: StreamMeter, sent: float, end: float) -> None:
    out.e2e = end - sent
    out.ttft = None if meter.first is None else meter.first - sent
    out.gaps = meter.gaps
    out.output_tokens = meter.tokens
    out.output_chars = meter.chars
    if meter.error is not None:
        out.error = meter.error
    elif not meter.done:
        out.error = "stream ended without [DONE]"


def _finish_body(out: Outcome, body: bytes, sent: float, end: float) -> None:
    out.e2e = out.ttft = end - sent
    if out.status != 200:
        out.error = body[:200].decode("utf-8", "replace")
        return
    try:
        data = orjson.loads(body)
        out.output_tokens = int(data["usage"]["completion_tokens"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        out.error = "malformed response body"


async def send_fast(pool: UpstreamPool, endpoint: Endpoint, req: Request, out: Outcome, sent: float) -> None:
    """Send `req` on the pooled client and fill `out` (timings relative to `sent`, a
    `time.monotonic()` stamp)."""
    body = orjson.dumps(req.body)
    try:
        resp = await pool.request(b"POST", CHAT_PATH, endpoint.headers(req), body)
    except UpstreamError as err:
        out.error = f"{err.code}: {err}"[:200]
        out.e2e = time.monotonic() - sent
        return
    out.status = resp.status
    _note_headers(out, resp.headers)
    try:
        if req.stream and resp.status == 200:
            meter = StreamMeter()
            async for chunk in resp:
                meter.feed(chunk, time.monotonic())
            _finish_stream(out, meter, sent, time.monotonic())
        else:
            data = await resp.read()
            _finish_body(out, data, sent, time.monotonic())
    except UpstreamError as err:
        out.error = f"{err.code}: {err}"[:200]
        out.e2e = time.monotonic() - sent
    finally:
        await resp.aclose()


async def send_slow(endpoint: Endpoint, req: Request, out: Outcome, sent: float, timeout: float) -> None:
    """Send `req` on its own small-buffered socket and read the stream at its reading speed."""
    pace = Pace(req.read_rate, req.read_bytes_per_s)
    origin = parse_origin(endpoint.url)
    body = orjson.dumps(req.body)
    head = [
        b"POST " + CHAT_PATH + b" HTTP/1.1",
        b"host: " + origin.host_header,
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    head += [k + b": " + v for k, v in endpoint.headers(req)]
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await _open_small(origin.host, origin.port)
            writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            await writer.drain()
            status, headers, chunked = await _read_head(reader)
            out.status = status
            _note_headers(out, headers)
            if status != 200:
                data = await reader.read(4096)
                _finish_body(out, data, sent, time.monotonic())
                return
            meter = StreamMeter()
            await _read_slowly(reader, meter, pace, chunked)
            _finish_stream(out, meter, sent, time.monotonic())
    except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as err:
        out.error = f"{type(err).__name__}: {err}"[:200]
        out.e2e = time.monotonic() - sent
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _open_small(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Set before connecting so the advertised window starts small, and with the segment
        # size of a real network path: on loopback (64 KiB segments) the sender's buffer would
        # grow to megabytes and hide the slow reader from it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SLOW_MSS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        # A small stream buffer: past 2 × limit the transport stops reading from the socket.
        return await asyncio.open_connection(sock=sock, limit=SLOW_READ_BYTES * 2)
    except BaseException:
        sock.close()
        raise


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, list[tuple[bytes, bytes]], bool]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if b":" in line:
            name, _, value = line.partition(b":")
            headers.append((name.strip().lower(), value.strip()))
    chunked = any(n == b"transfer-encoding" and b"chunked" in v.lower() for n, v in headers)
    return int(parts[1]), headers, chunked


@dataclass(frozen=True, slots=True)
class Pace:
    """A slow reader's speed: tokens per second (each token read costs 1/rate seconds of reading
    time), or bytes per second."""

    tokens_per_s: float | None
    bytes_per_s: float | None

    def cost(self, tokens: int, size: int) -> float:
        if self.tokens_per_s is not None:
            return tokens / self.tokens_per_s
        assert self.bytes_per_s is not None
        return size / self.bytes_per_s


async def _read_slowly(reader: asyncio.StreamReader, meter: StreamMeter, pace: Pace, chunked: bool) -> None:
    loop = asyncio.get_running_loop()
    next_read = loop.time()
    async for data in _body_pieces(reader, chunked):
        cost = pace.cost(meter.feed(data, time.monotonic()), len(data))
        if cost:
            next_read = max(next_read, loop.time()) + cost
            delay = next_read - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)


async def _body_pieces(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """Body bytes in small pieces, de-chunked when the response is chunked."""
    if not chunked:
        while data := await reader.read(SLOW_READ_BYTES):
            yield data
        return
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            return
        while size > 0:
            data = await reader.read(min(size, SLOW_READ_BYTES))
            if not data:
                raise asyncio.IncompleteReadError(b"", size)
            size -= len(data)
            yield data
        await reader.readexactly(2)
