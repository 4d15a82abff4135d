"""The chunked-prefill trade-off, measured: a long prompt arriving while other streams decode.

    python -m router.lab.sim.chunked sim  [--preset cpu-tiny] [--budgets 2048 1024 512 256 128]
    python -m router.lab.sim.chunked real --url URL [--api-key KEY] [--budget N]

`decodes` streams (64-token prompts) decode steadily; then a `long`-token prompt arrives, and
again `repeats` times. Every engine step carries at most `max_num_batched_tokens` tokens, decodes
first, so a large budget runs the whole prompt in one long step (every decode waits for it),
and a small one cuts it into chunks over several short steps (each decode waits one chunk,
while the long prompt waits for all of them). Reported: the decodes' ITL outside the prefill
(p50), their worst gap overlapping it, and the long prompt's TTFT — medians over the repeats.

`sim` starts one in-process simulated engine per budget. `real` measures one running server; its
budget is a server flag (`--max-num-batched-tokens`), so each budget needs its own server start.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from router.lab.sim.timedstream import completion_body, served_model, timed_stream, token_prompt

_DECODE_PROMPT = 64
_WARM_TOKENS = 16  # decode tokens every stream has before the first long prompt
_BETWEEN_TOKENS = 16  # decode tokens between two long prompts


@dataclass(frozen=True, slots=True)
class Spike:
    budget: int | None  # the engine's max_num_batched_tokens, when known
    decode_itl_p50: float  # decode gaps that do not overlap a long prefill
    decode_itl_worst: float  # largest decode gap overlapping a long prefill (median of repeats)
    long_ttft: float  # median of repeats


class Progress:
    """Token arrival times of several running streams, and a way to wait for them to grow."""

    def __init__(self, streams: int) -> None:
        self.times: list[list[float]] = [[] for _ in range(streams)]
        self._changed = asyncio.Event()

    def recorder(self, i: int) -> Callable[[float], None]:
        def record(t: float) -> None:
            self.times[i].append(t)
            self._changed.set()

        return record

    async def until_tokens(self, stream: int, count: int, timeout: float) -> None:
        times = self.times[stream]
        await self.until(lambda: len(times) >= count, timeout)

    async def until(self, condition: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()


def summarize(
    budget: int | None, decode_times: Sequence[Sequence[float]], windows: Sequence[tuple[float, float]]
) -> Spike:
    """Decode token times and the long prompts' (arrival, first token) windows → the spike."""
    calm: list[float] = []
    worst = [0.0] * len(windows)
    for times in decode_times:
        for a, b in itertools.pairwise(times[4:]):
            hit = [i for i, (start, end) in enumerate(windows) if b > start and a < end]
            for i in hit:
                worst[i] = max(worst[i], b - a)
            if not hit:
                calm.append(b - a)
    return Spike(
        budget=budget,
        decode_itl_p50=statistics.median(calm) if calm else 0.0,
        decode_itl_worst=statistics.median(worst),
        long_ttft=statistics.median(end - start for start, end in windows),
    )


async def measure_spike(
    url: str,
    *,
    api_key: str | None = None,
    budget: int | None = None,
    decodes: int = 8,
    long: int = 1800,
    repeats: int = 3,
    seed: int = 0,
    timeout: float = 120.0,
) -> Spike:
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=decodes + 2)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, timeout=timeout, limits=limits
    ) as c:
        model, max_model_len = await served_model(c)
        out_tokens = max_model_len - _DECODE_PROMPT - 1  # longer than the run: cancelled at the end
        progress = Progress(decodes)
        first = progress.times[0]
        tasks = []
        for i in range(decodes):
            body = completion_body(model, token_prompt(rng, _DECODE_PROMPT), out_tokens)
            tasks.append(asyncio.create_task(timed_stream(c, body, progress.recorder(i))))
        windows: list[tuple[float, float]] = []
        try:
            await progress.until(lambda: all(len(t) >= _WARM_TOKENS for t in progress.times), timeout)
            for _ in range(repeats):
                arrival = asyncio.get_running_loop().time()
                done = await timed_stream(c, completion_body(model, token_prompt(rng, long), 2))
                windows.append((arrival, done.token_times[0]))
                await progress.until_tokens(0, len(first) + _BETWEEN_TOKENS, timeout)
        finally:
            for task in tasks:
                task.cancel()  # closing the streams makes the server abort them
            await asyncio.gather(*tasks, return_exceptions=True)
    return summarize(budget, progress.times, windows)


async def sim_sweep(
    preset_name: str,
    budgets: Sequence[int],
    max_num_seqs: int,
    *,
    decodes: int,
    long: int,
    repeats: int,
    seed: int,
) -> list[Spike]:
    from router.lab.sim.profile import engine_config
    from router.lab.sim.serve import EngineSpec, SimCluster
    from router.lab.sim.server import ServerSettings
    from router.lab.sim.timing import load_preset

    preset = load_preset(preset_name)
    out = []
    for budget in budgets:
        config = engine_config(
            preset, {}, max_num_batched_tokens=budget, max_num_seqs=min(max_num_seqs, budget)
        )
        settings = ServerSettings(served_model_names=(preset.model,))
        spec = EngineSpec(port=0, config=config, timing=preset.timing, settings=settings)
        async with SimCluster([spec]) as cluster:
            url = cluster.urls[0]
            spike = await measure_spike(
                url, budget=budget, decodes=decodes, long=long, repeats=repeats, seed=seed
            )
            out.append(spike)
    return out


def format_table(spikes: Sequence[Spike]) -> str:
    rows = [
        "| max_num_batched_tokens | decode ITL p50 (ms) | decode ITL worst during the prefill (ms) "
        "| long prompt TTFT (ms) |",
        "|---:|---:|---:|---:|",
    ]
    for s in spikes:
        budget = str(s.budget) if s.budget is not None else "?"
        cells = (s.decode_itl_p50, s.decode_itl_worst, s.long_ttft)
        rows.append(f"| {budget} | " + " | ".join(f"{v * 1e3:.1f}" for v in cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m router.lab.sim.chunked",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="where", required=True)
    sim = sub.add_parser("sim", help="sweep budgets on in-process simulated engines")
    sim.add_argument("--preset", default="cpu-tiny")
    sim.add_argument("--budgets", type=int, nargs="+", default=[2048, 1024, 512, 256, 128])
    sim.add_argument("--max-num-seqs", type=int, default=16)
    real = sub.add_parser("real", help="measure one running server")
    real.add_argument("--url", required=True)
    real.add_argument("--api-key")
    real.add_argument("--budget", type=int, help="the server's --max-num-batched-tokens (a label)")
    for p in (sim, real):
        p.add_argument("--decodes", type=int, default=8)
        p.add_argument("--long", type=int, default=1800, help="long prompt, tokens")
        p.add_argument("--repeats", type=int, default=3)
        p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    kw = {"decodes": args.decodes, "long": args.long, "repeats": args.repeats, "seed": args.seed}
    if args.where == "sim":
        spikes = asyncio.run(sim_sweep(args.preset, args.budgets, args.max_num_seqs, **kw))
    else:
        spikes = [asyncio.run(measure_spike(args.url, api_key=args.api_key, budget=args.budget, **kw))]
    print(format_table(spikes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
