"""Counters, gauges and histograms for the request path, exposed exactly as prometheus_client's.

prometheus_client guards every value with a lock and walks a histogram's buckets one by one,
which the router pays several times per request and once per streamed chunk. The router updates
its metrics only from its event loop's thread, so these values are plain floats; a family is a
collector on the same registry and yields the same samples, in the same order, under the same
names (`_total` and `_created` for counters; `_bucket`, `_count`, `_sum` and `_created` for
histograms), so scrapes, recording rules and dashboards see no difference."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString

# How prometheus_client writes a bucket's bound ("0.005", "1.0", "+Inf").
_le_label: Final[Callable[[float], str]] = floatToGoString


def _created_series() -> bool:
    # The rule prometheus_client applies to its own metrics, read the same way.
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class CounterValue:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class GaugeValue:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


# The most cells a bucket table has: 8 KiB of pointers to small ints per histogram family, and
# as much again per histogram (its own buckets in the same cells).
TABLE_CELLS: Final = 1024


class Buckets:
    """A histogram's upper bounds (the last is +Inf) with their `le` labels, and a table that
    finds an amount's bucket without a search: cell `int(amount * scale)` holds the first bucket
    that amount can be in, and at most a step or two forward finds the one it is in.

    Why the table is exact: truncating `bound * scale` is monotone, so a bound below an amount
    never has a higher cell than the amount and a bound at or above it never a lower one. A cell
    holds the first bucket whose bound's cell is not lower than its own; every bucket before that
    one is below any amount of the cell, and the forward scan does the rest. Cells are as wide as
    the narrowest bucket (a bound per cell at most, so a step at most) and cover [0, `limit`);
    amounts outside that range, or not a number, are searched by bisection."""

    __slots__ = ("bounds", "cells", "le", "limit", "scale")

    def __init__(self, bounds: tuple[float, ...], le: tuple[str, ...]) -> None:
        self.bounds = bounds
        self.le = le
        edges = [0.0, *(b for b in bounds if 0.0 < b < INF)]
        widths = [high - low for low, high in itertools.pairwise(edges) if high > low]
        # Cells narrower than a nanosecond would buy nothing and could overflow the products.
        self.scale = 1.0 / max(min(widths), 1e-9) if widths else 1.0
        count = int(min(float(TABLE_CELLS), edges[-1] * self.scale + 2.0))
        self.limit = count / self.scale
        # A bound's cell, clamped to the table (-1: below it, count + 1: above it); clamping keeps
        # the cells in the order of their bounds, and no amount the table serves has either.
        cells = [int(max(-1.0, min(b * self.scale, count + 1.0))) for b in bounds[:-1]]
        # One cell more than the limit needs: an amount just below it may round up to its cell.
        self.cells = [next((i for i, c in enumerate(cells) if c >= q), len(cells)) for q in range(count + 1)]

    def index(self, amount: float) -> int:
        """The first bucket whose upper bound is >= amount."""
        bounds = self.bounds
        if 0.0 <= amount < self.limit:
            i: int = self.cells[int(amount * self.scale)]
            while bounds[i] < amount:
                i += 1
            return i
        # Compiled, this loop compares unboxed floats, where `bisect_left` would compare float
        # objects through the generic protocol.
        low = 0
        high = len(bounds) - 1
        while low < high:
            middle = (low + high) >> 1
            if bounds[middle] < amount:
                low = middle + 1
            else:
                high = middle
        return low


class _Bucket:
    """One bucket of one histogram: its upper bound and its own count (not cumulative) side by
    side, so an observation compares and counts in one object, and compiled, in place (a float
    kept in a list would be a new object for every observation; a stream observes one per
    chunk). `next` is the bucket after it; the last (+Inf) is its own, as no amount passes it."""

    __slots__ = ("bound", "count", "next")

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self.count = 0.0
        self.next = self


class HistogramValue:
    __slots__ = ("_buckets", "_cells", "_limit", "_scale", "_shared", "created", "le", "sum")

    def __init__(self, buckets: Buckets) -> None:
        self._shared = buckets
        self.le = buckets.le
        own = [_Bucket(bound) for bound in buckets.bounds]
        for bucket, after in itertools.pairwise(own):
            bucket.next = after
        self._buckets = own
        # The shared table with this histogram's own buckets in its cells: an observation then
        # reads one cell and the bucket it counts in, not an index, a bound and a count apart.
        self._cells = [own[i] for i in buckets.cells]
        self._scale = buckets.scale
        self._limit = buckets.limit
        self.sum = 0.0
        self.created = time.time()

    @property
    def counts(self) -> list[float]:
        """Each bucket's own count (not cumulative), in the order of the bounds."""
        return [bucket.count for bucket in self._buckets]

    def observe(self, amount: float) -> None:
        # `Buckets.index` on the buckets themselves: the same cell, the same steps forward.
        if 0.0 <= amount < self._limit:
            bucket = self._cells[int(amount * self._scale)]
            while bucket.bound < amount:
                bucket = bucket.next
        else:
            bucket = self._buckets[self._shared.index(amount)]
        bucket.count += 1.0
        self.sum += amount


V = TypeVar("V", CounterValue, GaugeValue, HistogramValue)


class Family(Generic[V]):
    """One metric family: a child per label values, made on first use and kept until removed."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        kind: str,
        make: Callable[[], V],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.kind = kind
        self._make: Callable[[], V] = make
        self._children: dict[tuple[str, ...], V] = {}
        registry.register(self)

    def labels(self, *values: str) -> V:
        found = self._children.get(values)
        if found is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            found = self._children[values] = self._make()
        return found

    def remove(self, *values: str) -> None:
        self._children.pop(values, None)

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        created = _created_series()
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            if isinstance(child, CounterValue):
                metric.add_sample(self.name + "_total", labels, child.value)
                if created:
                    metric.add_sample(self.name + "_created", labels, child.created)
            elif isinstance(child, GaugeValue):
                metric.add_sample(self.name, labels, child.value)
            else:
                _histogram_samples(metric, self.name, labels, child, created)
        return [metric]


def _histogram_samples(
    metric: Metric, name: str, labels: dict[str, str], child: HistogramValue, created: bool
) -> None:
    total = 0.0
    for le, count in zip(child.le, child.counts, strict=True):
        total += count
        metric.add_sample(name + "_bucket", {**labels, "le": le}, total)
    metric.add_sample(name + "_count", labels, total)
    metric.add_sample(name + "_sum", labels, child.sum)
    if created:
        metric.add_sample(name + "_created", labels, child.created)


def counter(
    name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
) -> Family[CounterValue]:
    return Family(
        name=name,
        documentation=documentation,
        labelnames=labelnames,
        kind="counter",
        make=CounterValue,
        registry=registry,
    )


def gauge(
    name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
) -> Family[GaugeValue]:
    return Family(
        name=name,
        documentation=documentation,
        labelnames=labelnames,
        kind="gauge",
        make=GaugeValue,
        registry=registry,
    )


def histogram(
    name: str,
    documentation: str,
    labelnames: Sequence[str],
    buckets: Sequence[float],
    registry: CollectorRegistry,
) -> Family[HistogramValue]:
    bounds = tuple(float(b) for b in buckets)
    if list(bounds) != sorted(bounds):
        raise ValueError(f"{name}: buckets not in sorted order")
    if bounds[-1] != INF:
        bounds += (INF,)
    shared = Buckets(bounds, tuple(_le_label(b) for b in bounds))
    return Family(
        name=name,
        documentation=documentation,
        labelnames=labelnames,
        kind="histogram",
        make=lambda: HistogramValue(shared),
        registry=registry,
    )
