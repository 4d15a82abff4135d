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

from router.tracecontext import NO_CLIENT_TRACE, ClientTrace

_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


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


@dataclass(slots=True)
class RequestRecord:
    """Times are `time.monotonic()` readings; `wall` is the arrival's `time.time()`."""

    request_id: bytes
    route: str
    wall: float
    started: float
    client_trace: ClientTrace = NO_CLIENT_TRACE
    trace: TraceIds | None = None
    key_name: str | None = None
    cls: str | None = None
    reason: str | None = None
    lane: str | None = None
    pool: str | None = None
    stream: bool | None = None
    classified_at: float | None = None  # key checked, body parsed, class and lane chosen
    admitted_at: float | None = None  # a backend slot taken
    backend: int | None = None  # the backend's index in its pool (its label's number)
    retries: int = 0
    connected_at: float | None = None  # the backend's response head received
    first_byte_at: float | None = None
    ended: float | None = None
    status: int = 0
    error_code: str | None = None
    client_disconnect: bool = False
    bytes_in: int = 0
    bytes_out: int = 0
    usage_tail: bytes | None = None  # the response's last bytes, where the usage report is

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
        at = tail.rfind(b'"usage"')
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
