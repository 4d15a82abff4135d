"""Routers measured side by side in one run: the same load sent to each in turn, round after
round, so drift of a shared machine is shared out among them rather than billed to whichever ran
last. Used by the experiments that compare router set-ups (router/lab/bench/workers_overhead.py,
router/lab/bench/sharedstate_overhead.py); router/lab/bench/overhead.py has the load itself."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from router.lab.bench.overhead import Sample, Scenario, cpu_seconds, load, wait_up

# Several routers start at once, on a machine that may be busy with other work.
STARTUP_S = 120.0

# A router under test: its origin, and the process whose CPU time is billed to it.
Target = tuple[str, int]


@dataclass
class Totals:
    """Every round of one router in one scenario, added up."""

    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: int = 0
    wall: float = 0.0
    cpu_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies)

    def add(self, sample: Sample, cpu_s: float) -> None:
        self.latencies += sample.latencies
        self.ttfts += sample.ttfts
        self.chunks += sample.chunks
        self.errors += sample.errors
        self.wall += sample.wall
        self.cpu_s += cpu_s

    def cpu_us_per_request(self) -> float:
        return self.cpu_s / max(1, self.requests) * 1e6


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and its children (a supervisor's workers)."""
    return cpu_seconds(pid) + sum(cpu_seconds(child) for child in _children(pid))


def _children(pid: int) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    yield int(entry.name)


async def alternate(
    scenarios: Sequence[Scenario],
    targets: Callable[[Scenario], Mapping[str, Target]],
    key: str,
    scale: float,
    rounds: int,
    cpu: Callable[[int], float] = cpu_seconds,
) -> dict[tuple[str, str], Totals]:
    """Each scenario against each of `targets(scenario)` (name → router): a warm-up of every
    router, then `rounds` rounds, each sending the scenario's share of requests to every router
    in turn. Totals by (scenario name, router name)."""
    totals: dict[tuple[str, str], Totals] = {}
    for sc in scenarios:
        routers = targets(sc)
        for origin, _ in routers.values():
            await wait_up(origin, b"/ready", STARTUP_S)
        count = max(sc.concurrency * 4, int(sc.requests * scale / rounds))
        for origin, _ in routers.values():
            await load(origin, sc, max(sc.concurrency * 2, count // 5), key)  # warm up every process
        for r in range(rounds):
            print(f"  {sc.name}: round {r + 1}/{rounds} …", file=sys.stderr, flush=True)
            for name, (origin, pid) in routers.items():
                cpu0 = cpu(pid)
                sample = await load(origin, sc, count, key)
                totals.setdefault((sc.name, name), Totals()).add(sample, cpu(pid) - cpu0)
    return totals
