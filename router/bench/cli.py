"""`lane-router bench …`: benchmarks that print tables."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser(
        "bench",
        help="benchmarks (router overhead, mixed-traffic lab)",
        description="Benchmarks that print tables.",
    )
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    overhead = sub.add_parser(
        "overhead",
        help="the router's own cost: the same load direct vs through the router",
        description="Start a fake backend, a router in front of it and a load generator as separate "
        "processes on loopback; run each scenario directly and through the router; print "
        "added latency, throughput and the router's CPU time per request and per chunk.",
    )
    overhead.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every scenario's request count (default 1.0; 0.2 for a quick look)",
    )
    overhead.set_defaults(func=cmd_overhead)
    bench.set_defaults(func=lambda _args: bench.print_help() or 2)


def cmd_overhead(args: argparse.Namespace) -> int:
    from router.bench.overhead import render, run

    rows = run(scale=args.scale)
    print(render(rows))
    return 0 if all(r.routed.errors == 0 and r.direct.errors == 0 for r in rows) else 1
