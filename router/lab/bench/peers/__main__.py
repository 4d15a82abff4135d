"""python -m router.lab.bench.peers — see the package docstring; `scripts/bench-peers.sh` installs
the peers and runs this."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import router.lab.bench.peers as package
from router.keys.auth import new_key
from router.lab.bench.peers import harness, report
from router.lab.bench.peers.scenarios import SCENARIOS
from router.lab.bench.peers.targets import KINDS, LABELS, Target, Tools, lane_router_targets

HERE = Path(__file__).resolve().parents[4]  # the source tree this module runs from
VLLM_ROUTER = Path.home() / ".cache/lane-router/peers/vllm-router-0.1.17/bin/vllm-router"
DURATION_S = {"nonstream": 4.0, "stream": 4.0, "paced": 5.0}  # per round


def _names(text: str, known: Sequence[str]) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(known)} (got {text!r})")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m router.lab.bench.peers",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--targets", type=lambda t: _names(t, KINDS), default=list(KINDS), help=",".join(KINDS))
    p.add_argument(
        "--scenarios",
        type=lambda t: _names(t, list(SCENARIOS)),
        default=list(SCENARIOS),
        help=",".join(SCENARIOS),
    )
    p.add_argument(
        "--lane-router-src",
        type=Path,
        action="append",
        default=[],
        help="the lane-router source tree to run (repeat to compare trees; default: this one)",
    )
    p.add_argument("--scale", type=float, default=1.0, help="times the default 4/4/5 s loads of a round")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="turns each target takes at every scenario, in rotating order (default 3)",
    )
    p.add_argument(
        "--together",
        action="store_true",
        help="in each round, every target's load at once (sharing the proxy core) instead of in turns; "
        "for two targets: the load core carries the backends and every load generator",
    )
    p.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of load before each measured one (0: none)"
    )
    p.add_argument("--max-requests", type=int, default=1_000_000, help="per load, at most")
    p.add_argument("--vllm-router", default=str(VLLM_ROUTER), help="the vllm-router executable")
    p.add_argument("--nginx", default="nginx", help="the nginx executable")
    p.add_argument("--wrk", default="wrk", help="the non-streamed scenario's client ('' = the own loadgen)")
    p.add_argument("--proxy-cpu", type=int, default=1)
    p.add_argument("--load-cpu", type=int, default=0)
    p.add_argument("--no-pin", action="store_true", help="run nothing under taskset")
    p.add_argument("--run-dir", type=Path, help="keep configs and logs here (default: a temporary directory)")
    p.add_argument("--command", help="the command to print in the header (default: this one)")
    return p


def settings(args: argparse.Namespace, run_dir: Path) -> harness.Settings:
    kinds: list[str] = args.targets
    chosen: list[Target] = [Target("direct", LABELS["direct"])] if "direct" in kinds else []
    for kind in KINDS:
        if kind == "lane-router" and kind in kinds:
            chosen += lane_router_targets(args.lane_router_src, HERE)
        elif kind in kinds and kind != "direct":
            chosen.append(Target(kind, LABELS[kind]))
    tools = Tools(sys.executable, args.vllm_router, args.nginx, shutil.which(args.wrk) if args.wrk else None)
    return harness.Settings(
        targets=chosen,
        scenarios=[SCENARIOS[name] for name in SCENARIOS if name in args.scenarios],
        duration_s={name: seconds * args.scale for name, seconds in DURATION_S.items()},
        warmup_s=args.warmup,
        tools=tools,
        run_dir=run_dir,
        key=new_key(),  # made for this run: nothing published opens these proxies
        proxy_cpu=None if args.no_pin else args.proxy_cpu,
        load_cpu=None if args.no_pin else args.load_cpu,
        max_requests=args.max_requests,
        rounds=max(1, args.rounds),
        together=args.together,
    )


def header(args: argparse.Namespace, s: harness.Settings, run: harness.Run, argv: Sequence[str]) -> list[str]:
    command = args.command or shlex.join(["python", "-m", "router.lab.bench.peers", *argv])
    if s.proxy_cpu is None:
        placing = "nothing pinned"
    else:
        placing = (
            f"each proxy on CPU {s.proxy_cpu} (`taskset -c {s.proxy_cpu}`), fake backends and load "
            f"generator on CPU {s.load_cpu} (`taskset -c {s.load_cpu}`)"
        )
    client = "wrk (1 thread)" if s.tools.wrk else "the own load generator"
    seconds = " / ".join(f"{s.duration_s[sc.name]:g}" for sc in s.scenarios)
    return [
        "## Proxy peers: proxy CPU per request and per chunk",
        "",
        f"Command: `{command}`",
        "",
        f"Started {run.started} on {os.cpu_count()} CPUs; {placing}. "
        f"Non-streamed client: {client}; streams: the own load generator. {s.rounds} rounds in "
        f"which {_turns(s)}, with loads of {seconds} s"
        + (f" ({s.warmup_s:g} s of warm-up before a target's first)" if s.warmup_s > 0 else "")
        + "; figures are over all rounds (TTFT: the median of the rounds'). Proxy CPU: utime + "
        "stime of its process tree (/proc/PID/stat), before and after each load.",
    ]


def _turns(s: harness.Settings) -> str:
    if s.together:
        return "every target carries its own load at the same time, the proxies sharing their core"
    return "the targets take turns, in an order that rotates each round"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)

    def progress(line: str) -> None:
        print(f"[peers {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="lane-router-peers-") as tmp:
        s = settings(args, args.run_dir or Path(tmp))
        run = harness.run(s, progress)
    lines = [report.render(run, header(args, s, run, argv)), "", "Launch commands:", ""]
    lines += [f"- {label}: `{command}`" for label, command in run.commands.items()]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
