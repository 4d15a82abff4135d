"""What a backend may take, in time and bytes, before and while it answers; and the one timer per
upstream connection that enforces the time limits (`router.proxy.upstream_connection`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NewType

# The phases of a response, each with its own time limit: a type of their own, so mypy refuses
# another vocabulary's values here (a NewType costs nothing compiled: it is its base type there).
ResponsePhase = NewType("ResponsePhase", int)
BEFORE_HEAD: Final = ResponsePhase(0)  # the request is written, no response byte yet
IN_HEAD: Final = ResponsePhase(1)  # the head is arriving
IN_BODY: Final = ResponsePhase(2)  # the body is arriving


@dataclass(frozen=True, slots=True)
class ResponseLimits:
    """`head_timeout` runs from the request's write to the response's first byte (a non-streamed
    answer shows nothing until it is generated); `head_read_timeout` from that byte to the end
    of the head, so a head dribbled out byte by byte is cut; `read_timeout` is the longest
    silence between body reads. A response head, interim responses included, may hold at most
    `max_head_bytes` bytes and `max_headers` fields."""

    head_timeout: float = 600.0
    head_read_timeout: float = 10.0
    read_timeout: float = 60.0
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100

    def __post_init__(self) -> None:
        if min(self.head_timeout, self.head_read_timeout, self.read_timeout) <= 0:
            raise ValueError("response timeouts must be > 0")
        if self.max_head_bytes < 1024 or self.max_headers < 1:
            raise ValueError("max_head_bytes must be ≥ 1024 and max_headers ≥ 1")

    def deadline(self, phase: ResponsePhase, since: float) -> float:
        """When `phase` times out; `since` is when it began (BEFORE_HEAD, IN_HEAD) or the latest
        body read (IN_BODY)."""
        if phase == IN_BODY:
            return since + self.read_timeout
        if phase == IN_HEAD:
            return since + self.head_read_timeout
        return since + self.head_timeout

    def timed_out(self, phase: ResponsePhase) -> str:
        if phase == IN_BODY:
            return f"no response body data for {self.read_timeout:g}s"
        if phase == IN_HEAD:
            return f"response head incomplete {self.head_read_timeout:g}s after its first byte"
        return f"no response within {self.head_timeout:g}s"


class DeadlineTimer:
    """One timer, firing no later than the earliest deadline asked of it. Moving a deadline later
    costs nothing: the owner, called back early, asks again for the deadline it has by then.
    Only a deadline moved earlier re-schedules the timer."""

    __slots__ = ("_at", "_callback", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0

    def arm_by(self, deadline: float) -> None:
        handle = self._handle
        if handle is not None:
            if self._at <= deadline:
                return
            handle.cancel()
        self._at = deadline
        self._handle = self._loop.call_at(deadline, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._callback()
