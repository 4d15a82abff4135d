"""Whether a finished request met its lane's SLO, judged from what the relay already measured
(no clock is read here). Pure.

A request is judged once, when its exchange ends:

* answered (a status below 400): met when every bound holds, else missed by the first bound it
  missed, in the order ttft, itl, e2e. A response without a body byte takes its end as its
  first byte. `itl` bounds the request's own 95th-percentile gap between streamed chunks, as the
  lab does (router/lab/bench/report.py): met when at most one gap in 20 exceeds the bound.
* failed (429 or 5xx: its lane's queue was full or timed out, its backend failed or timed out,
  or the router could not finish it): missed, `failed`.
* refused for its own sake (any other 4xx: a request the backend or lane would not take as
  written): not counted, it says nothing about the service.
* left by its client: missed when a bound had already been missed by then (its first byte or
  its end past the bound, or too many late gaps), else not counted: a cancelled request is not a
  miss, an abandoned slow one is.

Requests refused before their lane (their key's rate limits, authentication, a body the router
rejects) are not counted either."""

from __future__ import annotations

import math
from typing import Final

MET: Final = ""
TTFT: Final = "ttft"
ITL: Final = "itl"
E2E: Final = "e2e"
FAILED: Final = "failed"
REASONS: Final = (TTFT, ITL, E2E, FAILED)
UNBOUNDED: Final = math.inf
# The share of a request's gaps that may exceed the ITL bound: one in ITL_ALLOWANCE (its p95).
ITL_ALLOWANCE: Final = 20


class Slo:
    """A lane's bounds in seconds, UNBOUNDED where none is set."""

    __slots__ = ("e2e_s", "itl_s", "ttft_s")

    def __init__(self, ttft_s: float, itl_s: float, e2e_s: float) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.e2e_s = e2e_s


def judge(
    slo: Slo,
    status: int | str,
    gone: bool,
    ttft: float | None,
    elapsed: float,
    gaps: int,
    late: int,
) -> str | None:
    """MET, the reason a request missed, or None when it is not counted. `status`: the relay's
    (an HTTP status, or a word when none was sent); `gone`: its client left; `ttft`, `elapsed`:
    seconds from arrival to the first byte (None if none) and to the end; `gaps`, `late`: its
    timed chunk gaps, and those over the ITL bound. One function, not one per rule: it runs for
    every request."""
    if not gone and status != 200:
        if not isinstance(status, int) or status == 429 or status >= 500:
            return FAILED
        if status >= 400:
            return None
    if (elapsed if ttft is None else ttft) > slo.ttft_s:
        return TTFT
    if late * ITL_ALLOWANCE > gaps:
        return ITL
    if elapsed > slo.e2e_s:
        return E2E
    return None if gone else MET
