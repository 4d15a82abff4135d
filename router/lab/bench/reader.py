"""A streamed answer as a reader of limited speed takes it, for the virtual clock. Pure.

The engine produces pieces (one token, then `stream_interval` tokens each) whether or not the
client keeps up — vLLM queues output per request. A reader of `rate` tokens/s takes a piece when
it is there and it has finished with the previous one. What is produced but not yet read waits
in the buffers between them: the router's relay and the sockets. The router measures exactly
that (its upstream buffer plus the unacknowledged send queue) against `lag_bytes` to recognise a
slow client.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReadStream:
    produced: list[float]
    read: list[float]
    pieces: list[int]  # tokens per piece

    @property
    def done(self) -> float:
        return self.read[-1]

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.read)]


def split_tokens(tokens: int, pieces: int) -> list[int]:
    """The first piece carries one token (the first token goes out alone), the rest share the
    remainder as evenly as whole tokens allow."""
    if pieces <= 1:
        return [max(1, tokens)]
    rest, extra = divmod(max(0, tokens - 1), pieces - 1)
    return [1] + [rest + (1 if i < extra else 0) for i in range(pieces - 1)]


def read_stream(first: float, gaps: Sequence[float], tokens: int, rate: float | None) -> ReadStream:
    """Pieces produced at `first` and after each gap, read at most `rate` tokens/s (None: as fast
    as they come)."""
    produced = list(itertools.accumulate(gaps, initial=first))
    pieces = split_tokens(tokens, len(produced))
    if rate is None:
        return ReadStream(produced, list(produced), pieces)
    read = [first]
    for t, before in zip(produced[1:], pieces, strict=False):
        read.append(max(t, read[-1] + before / rate))
    return ReadStream(produced, read, pieces)


def first_lag(stream: ReadStream, piece_bytes: Callable[[int], int], lag_bytes: int) -> float | None:
    """When bytes produced but not yet read first exceed `lag_bytes` (None: never)."""
    sizes = [piece_bytes(n) for n in stream.pieces]
    read_times = stream.read
    undelivered = 0
    taken = 0  # pieces read so far
    for k, t in enumerate(stream.produced):
        undelivered += sizes[k]
        while taken <= k and read_times[taken] <= t:
            undelivered -= sizes[taken]
            taken += 1
        if undelivered > lag_bytes:
            return t
    return None
