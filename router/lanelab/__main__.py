"""`python -m router.lanelab EXPERIMENT…`: run lane-policy experiments, print markdown tables."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from router.lanelab.experiments import EXPERIMENTS, markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router.lanelab", description=__doc__)
    parser.add_argument("experiments", nargs="+", choices=sorted(EXPERIMENTS))
    parser.add_argument(
        "--duration", type=float, help="seconds of arrivals per run (default: each experiment's)"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        for name in args.experiments:
            began = time.monotonic()
            kwargs = {"duration": args.duration} if args.duration else {}
            rows = runner.run(EXPERIMENTS[name](**kwargs))
            print(f"## {name}  ({time.monotonic() - began:.0f} s)\n\n{markdown(rows)}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
