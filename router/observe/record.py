"""One record per proxied request: what the request path learned, filled in as it goes and read
once, at the end, by whoever observes requests (the access log, the tracer).

The request path only stores values it already has (names, counts, clock readings); anything
that costs work — parsing the usage report, formatting times, building spans — is done by the
readers, off the event loop where they can. The record holds no key and no prompt: only the
key's name, and token counts."""

from __future__ import annotations

import itertools
import os
import re
import time
from dataclasses import dataclass
from typing import Final

from router.keys.ratelimit import usage_at
from router.observe.tracecontext import NO_CLIENT_TRACE, ClientTrace

_PROMPT: Final = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION: Final = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class RequestIds:
    """Ids for requests that bring none: a random prefix drawn once per process, then a
    counter. As unique as a random id per request, without reading the system's randomness
    for each."""

    __slots__ = ("_next", "_prefix")

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex().encode()
        self._next = itertools.count().__next__

    def fresh(self) -> bytes:
        return b"%s%08x" % (self._prefix, self._next())


@dataclass(slots=True)
class TraceIds:
    """The router's ids in a trace, fixed when the request arrives so the upstream request can
    carry them: the trace (the client's, or a new one), the request's span, the upstream span."""

    trace_id: bytes
    span_id: bytes
    upstream_span_id: bytes
    sampled: bool


class RequestRecord:
    """Times are `time.monotonic()` readings; `wall` is the arrival's `time.time()`. A plain
    slotted class, not a dataclass: one is built per request, and this `__init__` takes only
    what the arrival knows and sets the rest from constants."""

    __slots__ = (
        "admitted_at",
        "backend",
        "bytes_in",
        "bytes_out",
        "classified_at",
        "client_disconnect",
        "client_trace",
        "cls",
        "connected_at",
        "ended",
        "error_code",
        "first_byte_at",
        "key_name",
        "lane",
        "pool",
        "reason",
        "request_id",
        "retries",
        "route",
        "slo",
        "started",
        "status",
        "stream",
        "trace",
        "usage_tail",
        "wall",
    )

    def __init__(
        self,
        request_id: bytes,
        route: str,
        wall: float,
        started: float,
        client_trace: ClientTrace = NO_CLIENT_TRACE,
    ) -> None:
        self.request_id = request_id
        self.route = route
        self.wall = wall
        self.started = started
        self.client_trace = client_trace
        self.trace: TraceIds | None = None
        self.key_name: str | None = None
        self.cls: str | None = None
        self.reason: str | None = None
        self.lane: str | None = None
        self.pool: str | None = None
        self.stream: bool | None = None
        self.classified_at: float | None = None  # key checked, body parsed, class and lane chosen
        self.admitted_at: float | None = None  # a backend slot taken
        self.backend: int | None = None  # the backend's index in its pool (its label's number)
        self.retries = 0
        self.connected_at: float | None = None  # the backend's response head received
        self.first_byte_at: float | None = None
        self.ended: float | None = None
        self.status = 0
        self.error_code: str | None = None
        self.client_disconnect = False
        self.bytes_in = 0
        self.bytes_out = 0
        self.usage_tail: bytes | None = None  # the response's last bytes, where the usage report is
        self.slo: str | None = None  # its SLO verdict: "" met, the bound missed, None not judged

    def __repr__(self) -> str:
        return f"RequestRecord({self.request_id!r}, {self.route!r}, status={self.status})"

    def end(self, status: int, now: float | None = None) -> None:
        self.status = status
        self.ended = time.monotonic() if now is None else now

    def trace_id(self) -> bytes | None:
        """The trace the request belongs to: the router's, else the client's."""
        if self.trace is not None:
            return self.trace.trace_id
        parent = self.client_trace.parent
        return parent.trace_id if parent is not None else None

    def usage(self) -> tuple[int | None, int | None]:
        """Prompt and completion tokens from the last usage report the response carried."""
        tail = self.usage_tail
        if not tail:
            return None, None
        at = usage_at(tail)
        if at < 0:
            return None, None
        report = tail[at:]
        prompt, completion = _PROMPT.search(report), _COMPLETION.search(report)
        return (
            int(prompt.group(1)) if prompt else None,
            int(completion.group(1)) if completion else None,
        )


def span_ms(start: float | None, end: float | None) -> float | None:
    """Milliseconds between two readings, rounded to microseconds; None if either is missing."""
    if start is None or end is None:
        return None
    return round((end - start) * 1000.0, 3)
