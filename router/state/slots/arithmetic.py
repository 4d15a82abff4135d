"""The arithmetic of shared slots, pure: what router/state/slots/scripts.py does inside Redis, stated
once in Python so tests can hold the scripts to it.

A slot hash (one per backend, one per lane) holds totals — `f` requests in flight, `p` of them
prefilling, `l` of those long — and the same counters per holder (`f:<holder>`, …), the holder
being one router process. A take checks and charges in one step; a release takes off at most
what its holder holds (a holder that was reaped holds nothing, so its late releases change
nothing), and says whether it freed a resource that was full, for that is when waiters
elsewhere may go."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.lanes.admission import PrefillLimits

# `take`'s answers besides a candidate's 1-based position.
NO_ROOM = 0  # no candidate has prefill room for this request
LANE_FULL = -1  # the lane has no in-flight slot left
UNKNOWN_HOLDER = -2  # the holder has no heartbeat: it was reaped, or Redis lost its data
SETTLING = -3  # Redis lost its data moments ago: processes re-home what they hold first


@dataclass(frozen=True, slots=True)
class SlotCounts:
    in_flight: int = 0
    prefilling: int = 0
    long_prefilling: int = 0


@dataclass(frozen=True, slots=True)
class TakeRule:
    """What one take asks: the lane's slot too (unless the request holds it from an earlier
    attempt), and a backend with room for a prompt of this length under these limits."""

    take_lane: bool
    lane_limit: int | None
    long: bool
    limits: PrefillLimits
    lane_part: int | None = None  # this process's part of the lane limit, recorded with the take


def take(lane_count: int, candidates: Sequence[SlotCounts], rule: TakeRule, known: bool = True) -> int:
    """The candidate taken (1-based: the first in order with room), or why none was."""
    if not known:
        return UNKNOWN_HOLDER
    if rule.take_lane and rule.lane_limit is not None and lane_count >= rule.lane_limit:
        return LANE_FULL
    for position, counts in enumerate(candidates, 1):
        if rule.limits.has_room(counts, rule.long):
            return position
    return NO_ROOM


def taken(counts: SlotCounts, long: bool) -> SlotCounts:
    """A backend's counts once a request is charged to it."""
    return SlotCounts(counts.in_flight + 1, counts.prefilling + 1, counts.long_prefilling + int(long))


@dataclass(frozen=True, slots=True)
class Released:
    total: int  # the counter's total afterwards
    held: int  # what the holder holds afterwards
    frees: bool  # the resource was full and no longer is


def release(total: int, held: int, amount: int, limit: int | None) -> Released:
    """A holder gives back `amount` of one counter; it cannot give back more than it holds."""
    given = min(held, amount)
    frees = limit is not None and given > 0 and total >= limit > total - given
    return Released(max(0, total - given), held - given, frees)
