"""Repeated-prefix memory for classification: how often a prompt prefix was seen lately.

Bounded: at most `max_entries` fingerprints, least recently seen dropped first, and per
fingerprint only the timestamps that can still matter (the last `seen` sightings)."""

from __future__ import annotations

from collections import OrderedDict, deque


class PrefixHistory:
    def __init__(self, *, seen: int, window_s: float, max_entries: int) -> None:
        self._keep = seen
        self._window = window_s
        self._max = max_entries
        self._entries: OrderedDict[bytes, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def observe(self, fingerprint: bytes, now: float) -> int:
        """Record one sighting; return how many earlier sightings fall within the window."""
        times = self._entries.get(fingerprint)
        if times is None:
            times = deque(maxlen=self._keep)
            self._entries[fingerprint] = times
            if len(self._entries) > self._max:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(fingerprint)
        horizon = now - self._window
        while times and times[0] < horizon:
            times.popleft()
        earlier = len(times)
        times.append(now)
        return earlier
