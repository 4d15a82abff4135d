"""Run a trace in real time against a live router (or any OpenAI-compatible URL).

Arrivals are open loop: each request is sent at its trace time whether or not earlier ones have
been answered. Agent sessions are closed loop within themselves: a step is sent `think_s` after
the previous step's answer; a failed step ends its session, and the steps it never sent are
recorded as failures, because the user's task failed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.lab.bench.generate import Item, Request, SessionPlan, Trace
from router.lab.bench.loadclient import Endpoint, new_outcome, send_fast, send_slow
from router.lab.bench.outcome import Outcome
from router.lab.bench.progress import Bar
from router.proxy.upstream import UpstreamPool

ABANDONED = "session ended by an earlier failed step"
UNFINISHED = "not finished when the run ended"


@dataclass(frozen=True, slots=True)
class RealtimeOptions:
    drain_s: float = 180.0  # how long to wait for answers after the last arrival
    request_timeout_s: float = 600.0
    max_connections: int = 4096
    progress: bool = True
    desc: str = "bench"


class _Run:
    def __init__(
        self,
        items: Sequence[Item],
        endpoint: Endpoint,
        opts: RealtimeOptions,
        sink: Callable[[Outcome], None] | None,
        bar: Bar,
    ) -> None:
        self.items = items
        self.endpoint = endpoint
        self.opts = opts
        self.sink = sink
        self.bar = bar
        self.outcomes: list[Outcome] = []
        self.failures = 0
        self.start = 0.0
        self.pool = UpstreamPool(
            endpoint.url,
            max_connections=opts.max_connections,
            read_timeout=opts.request_timeout_s,
            connect_timeout=10.0,
        )

    def record(self, out: Outcome) -> None:
        self.outcomes.append(out)
        if not out.ok:
            self.failures += 1
            self.bar.note(f"{self.failures} failed")
        self.bar.update()
        if self.sink is not None:
            self.sink(out)

    async def one(self, req: Request) -> Outcome:
        sent = time.monotonic()
        out = new_outcome(req, sent - self.start)
        try:
            if req.slow:
                await send_slow(self.endpoint, req, out, sent, self.opts.request_timeout_s)
            else:
                await send_fast(self.pool, self.endpoint, req, out, sent)
        except asyncio.CancelledError:
            out.error = UNFINISHED
            raise
        finally:
            self.record(out)
        return out

    async def session(self, plan: SessionPlan) -> None:
        sent = 0
        try:
            for step in plan.steps:
                if sent:
                    await asyncio.sleep(step.think_s)
                sent += 1  # counted before sending: `one` records the step whatever happens
                if not (await self.one(step)).ok:
                    break
        finally:
            self.abandon(plan.steps[sent:])

    def abandon(self, steps: tuple[Request, ...]) -> None:
        now = time.monotonic() - self.start
        for step in steps:
            out = new_outcome(step, now)
            out.error = ABANDONED
            self.record(out)

    async def launch(self) -> set[asyncio.Task[object]]:
        tasks: set[asyncio.Task[object]] = set()
        loop = asyncio.get_running_loop()
        for item in self.items:
            delay = self.start + item.arrival - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            coro = self.session(item) if isinstance(item, SessionPlan) else self.one(item)
            tasks.add(loop.create_task(coro))
        return tasks


async def run_realtime(
    trace: Trace,
    endpoint: Endpoint,
    opts: RealtimeOptions | None = None,
    sink: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Send every request of `trace` to `endpoint`; return the outcomes in completion order."""
    return await run_items(trace.items, endpoint, opts, sink)


async def run_items(
    items: Sequence[Item],
    endpoint: Endpoint,
    opts: RealtimeOptions | None = None,
    sink: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Send `items` (requests and sessions, in arrival order) to `endpoint`; the outcomes in
    completion order."""
    opts = opts or RealtimeOptions()
    count = sum(len(i.steps) if isinstance(i, SessionPlan) else 1 for i in items)
    with Bar(count, opts.desc, enabled=opts.progress) as bar:
        run = _Run(items=items, endpoint=endpoint, opts=opts, sink=sink, bar=bar)
        tasks: set[asyncio.Task[object]] = set()
        run.start = time.monotonic()
        try:
            tasks = await run.launch()
            if tasks:
                await asyncio.wait(tasks, timeout=opts.drain_s)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
            await run.pool.aclose()
    return run.outcomes
