"""`lane-router evidence example`: the worked example of docs/evidence.md, run for real."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from router.config.load import ConfigError
from router.evidence.cli import parse_slo, unusable
from router.evidence.records import EvidenceError
from router.lab.evidence.walkthrough import Paths, Scale, problems, run_example


def configure(name: str, example: argparse.ArgumentParser) -> None:
    example.description = (
        "Start simulated engines and the router for config A (interactive pool: TP=1, "
        "8,192-token context, 8 sequences), measure it with `bench run --evidence`, decide every "
        "lane with `check --evidence` and start `serve --require-evidence`; ask A's record for a "
        "larger target (`evidence decide`); then config B (TP=2, "
        "16,384 context): DEFER with its retest triggers, the gate refuses, B is measured and "
        "passes; `evidence diff` compares the two chat records. Each step is a lane-router "
        "command, printed before it runs; everything is on 127.0.0.1 and stops by itself."
    )
    example.epilog = (
        "exit status: 0 the run came out as documented, 1 it did not (each difference is "
        "printed), 2 unusable input"
    )
    example.add_argument(
        "--out", type=Path, metavar="DIR", help="new or empty directory (default: evidence-example-<time>)"
    )
    example.add_argument(
        "--rate", type=float, default=2.5, help="requests/s of each measurement (default 2.5)"
    )
    example.add_argument(
        "--duration", type=float, default=24.0, help="seconds of arrivals of each measurement (default 24)"
    )
    example.add_argument(
        "--warmup", type=float, default=3.0, help="seconds of unmeasured load first (default 3)"
    )
    example.add_argument(
        "--preset", default="h100-llama3-8b", help="simulator preset (default h100-llama3-8b)"
    )
    example.add_argument(
        "--slo", action="append", default=[], metavar="KEY=VALUE", help="SLO override, as for `decide`"
    )
    example.set_defaults(func=run_example_command)


def run_example_command(args: argparse.Namespace) -> int:
    began = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    scale = Scale(
        rate=args.rate, duration=args.duration, warmup=args.warmup, preset=args.preset, slo=tuple(args.slo)
    )
    try:
        parse_slo(scale.slo)
        outcome = run_example(Paths.under(args.out or Path(f"evidence-example-{stamp}")), scale, _say)
    except (ValueError, OSError, ConfigError) as exc:
        return unusable(str(exc))
    except (RuntimeError, subprocess.SubprocessError, EvidenceError) as exc:
        # The example writes its own store: a record it cannot read back is a failed run.
        print(f"lane-router evidence example: {exc}", file=sys.stderr)
        return 1
    wrong = problems(outcome)
    for problem in wrong:
        print(f"not as documented: {problem}")
    if any("slo_missed" in problem for problem in wrong):
        print(
            "(the simulated engines run in real time on this machine's CPU: on a busy machine their "
            "latency grows and the gate DEFERs for slo_missed, as it should)"
        )
    verdict = "differs from the documented example" if wrong else "came out as documented"
    print(f"\nthe run {verdict}; {time.monotonic() - began:.0f} s; every process stopped.")
    return 1 if wrong else 0


def _say(text: str) -> None:
    print(text, flush=True)
