"""A minimal discrete driver for engine tests: arrivals at given times, steps back to back."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

from router.lab.sim.config import EngineConfig
from router.lab.sim.engine import Engine, StepResult
from router.lab.sim.request import EngineRequest, new_request
from router.lab.sim.timing import StepTimeModel

TIMING = StepTimeModel(c0=0.005, c_prefill=1e-4, c_decode=1e-3, c_ctx=1e-6)


def prompt(tag: int, n: int) -> list[int]:
    return [tag * 100_000 + i for i in range(n)]


def req(
    rid: str, n_prompt: int, out: int, *, tag: int | None = None, t: float = 0.0, priority: int = 0
) -> EngineRequest:
    return new_request(
        rid,
        prompt(zlib.crc32(rid.encode()) % 1000 if tag is None else tag, n_prompt),
        max_tokens=out,
        ignore_eos=True,
        arrival_time=t,
        priority=priority,
    )


def run(
    engine: Engine,
    arrivals: Sequence[EngineRequest],
    *,
    on_step: Callable[[StepResult], None] | None = None,
    max_steps: int = 100_000,
) -> float:
    """Drive the engine until every request finished; returns the end time."""
    pending = sorted(arrivals, key=lambda r: r.arrival_time)
    now = 0.0
    for _ in range(max_steps):
        while pending and pending[0].arrival_time <= now:
            r = pending.pop(0)
            engine.add_request(r, r.arrival_time)
        if not engine.has_work:
            if not pending:
                return now
            now = pending[0].arrival_time
            continue
        result = engine.step(now)
        assert result is not None, "work left but nothing schedulable"
        if on_step:
            on_step(result)
        now = result.end
    raise AssertionError("engine did not finish")


def engine(**overrides: object) -> Engine:
    base: dict[str, object] = dict(
        max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=16, num_gpu_blocks=1024, block_size=16
    )
    base.update(overrides)
    return Engine(EngineConfig(**base), TIMING)  # type: ignore[arg-type]
