"""`lane-router bench …` (router overhead, the mixed-traffic lab, the lane-policy experiments) and
`lane-router demo`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEFAULT_WORKLOAD = Path("config/workloads/mixed-six.yaml")
DEFAULT_PRESET = "h100-llama3-8b"
TENANTS_WORKLOAD = Path("config/workloads/noisy-tenant.yaml")
# router/lab/bench/tenants.py MODES, named here so that `--help` imports no simulator.
TENANT_MODES = ("fifo", "fair", "fair-tokens")
# router/lab/bench/lanepolicies.py EXPERIMENTS, named here so that `--help` imports no experiment.
EXPERIMENT_NAMES = ("admission", "affinity", "p2c", "slow")
# router/lab/bench/prefix.py SCENARIOS and STRATEGIES, named here for the same reason.
PREFIX_SCENARIOS = ("rag", "agent", "churn", "fits", "bare")
PREFIX_STRATEGIES = ("precise_prefix", "prefix_affinity", "least_outstanding")


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """The arguments of `bench` or `demo` (router/cli.py runs the one named)."""
    {"bench": _bench_arguments, "demo": _demo_arguments}[name](parser)


def _bench_arguments(bench: argparse.ArgumentParser) -> None:
    bench.description = "Benchmarks that print tables."
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    _register_overhead(sub)
    _register_run(sub)
    _register_compare(sub)
    _register_lanes(sub)
    _register_tenants(sub)
    _register_prefix(sub)
    bench.set_defaults(func=lambda _args: _usage(bench))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.description = (
        "Start simulated vLLM engines for the embedded class-aware profile and the "
        "router in front of them (printing a key made for this run, to send requests of your own), "
        "send a short mixed six-class workload through the router, "
        "print the per-class table and where the per-request JSONL went, then stop everything."
    )
    demo.add_argument("--rate", type=float, default=3.0, help="requests/s (default 3)")
    demo.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals (default 20)")
    demo.add_argument("--out", type=Path, help="JSONL file (default: lane-router-demo-<time>.jsonl)")
    demo.add_argument("--no-progress", dest="progress", action="store_false")
    demo.set_defaults(func=cmd_demo)


def _register_lanes(sub: Any) -> None:
    lanes = sub.add_parser(
        "lanes",
        help="the lane-policy experiments (prefix affinity, power of two, admission, slow clients)",
        description="Measure lane policies end to end: for every row, fresh simulated engines in "
        "this process and a fresh router process, the same seeded load; prints one markdown table "
        "per experiment (docs/lane-policies.md holds the measured ones).",
    )
    lanes.add_argument("experiments", nargs="+", choices=EXPERIMENT_NAMES)
    lanes.add_argument(
        "--duration", type=float, help="seconds of arrivals per run (default: each experiment's)"
    )
    lanes.set_defaults(func=cmd_lanes)


def _register_tenants(sub: Any) -> None:
    tenants = sub.add_parser(
        "tenants",
        help="a workload's tenants on a shared lane: first come first served vs fair queueing",
        description="Run a workload that names tenants (default: one floods a shared lane, three "
        "keep their rate) on the simulator's virtual clock, with the router's lane queue, once per "
        "mode: fifo (every tenant one key), fair (a key per tenant, by requests), fair-tokens (by "
        "tokens). Prints per tenant the share of requests that met its SLO, TTFT p50/p95 and "
        "answered throughput, side by side; writes tenants.md and tenants.png to --out.",
    )
    tenants.add_argument(
        "--workload", type=Path, default=TENANTS_WORKLOAD, help=f"workload file (default {TENANTS_WORKLOAD})"
    )
    tenants.add_argument(
        "--rate",
        type=float,
        default=8.0,
        help="offered load of the tenants given a share, requests/s (default 8)",
    )
    tenants.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals (default 40)")
    tenants.add_argument("--seed", type=int, help="override the workload's seed")
    tenants.add_argument(
        "--modes",
        default="fifo,fair",
        help=f"comma-separated, of {', '.join(TENANT_MODES)} (default fifo,fair)",
    )
    tenants.add_argument(
        "--profile",
        type=Path,
        help="the router's profile (default: the lab's, one lane of four slots on one engine)",
    )
    tenants.add_argument(
        "--preset", default=DEFAULT_PRESET, help=f"simulator preset (default {DEFAULT_PRESET})"
    )
    tenants.add_argument("--out", type=Path, default=Path("lab-results/tenants"), help="output directory")
    tenants.add_argument(
        "--realtime",
        action="store_true",
        help="run the real router (its own process) in front of simulated engines in real time, "
        "each tenant with a key made for the run (fair-tokens: every lane with fair_by: tokens)",
    )
    tenants.add_argument("--no-progress", dest="progress", action="store_false")
    tenants.set_defaults(func=cmd_tenants)


def _register_prefix(sub: Any) -> None:
    prefix = sub.add_parser(
        "prefix",
        help="precise (KV events), approximate and least-outstanding placement under cache pressure",
        description="Run each scenario (config/workloads/prefix-*.yaml on a fleet of simulated "
        "engines) on the virtual clock once per balance strategy, the engines publishing their KV "
        "events into the router's view of their caches. Prints per scenario and strategy the "
        "engines' own prefix-cache hit rate, TTFT p50/p95, goodput (requests within SLO per second "
        "per engine) and the backends judged by approximation; writes prefix.md and prefix.png "
        "to --out.",
    )
    prefix.add_argument(
        "--scenarios",
        default=",".join(PREFIX_SCENARIOS[:4]),
        help=f"comma-separated, of {', '.join(PREFIX_SCENARIOS)} (default rag,agent,churn,fits)",
    )
    prefix.add_argument(
        "--strategies",
        default=",".join(PREFIX_STRATEGIES),
        help=f"comma-separated balance strategies, each NAME or NAME:KEY=VALUE:... with its settings "
        f"(default {','.join(PREFIX_STRATEGIES)})",
    )
    prefix.add_argument("--duration", type=float, help="seconds of arrivals (default: each scenario's, 120)")
    prefix.add_argument(
        "--delay-ms",
        type=float,
        default=5.0,
        help="publication delay: from an engine step's end to its KV events in the router's view (default 5)",
    )
    prefix.add_argument("--seed", type=int, help="override the workloads' seeds")
    prefix.add_argument("--workloads", type=Path, default=Path("config/workloads"), help="workload directory")
    prefix.add_argument(
        "--preset", default=DEFAULT_PRESET, help=f"simulator preset (default {DEFAULT_PRESET})"
    )
    prefix.add_argument("--out", type=Path, default=Path("lab-results/prefix"), help="output directory")
    prefix.add_argument("--no-progress", dest="progress", action="store_false")
    prefix.set_defaults(func=cmd_prefix)


def _register_overhead(sub: Any) -> None:
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
    overhead.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="instead: the router as one process against `serve --workers N` (both ways of sharing the port)",
    )
    overhead.add_argument("--rounds", type=int, default=2, help="with --workers: alternations (default 2)")
    overhead.add_argument(
        "--tls",
        action="store_true",
        help="the router serves TLS (a certificate made for the run) to the load client; backends stay HTTP",
    )
    overhead.add_argument(
        "--new-connections",
        action="store_true",
        help="instead of the usual loads: one client opening a new connection per request "
        "(with --tls, the cost of a handshake)",
    )
    overhead.set_defaults(func=cmd_overhead)


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload", type=Path, default=DEFAULT_WORKLOAD, help=f"workload file (default {DEFAULT_WORKLOAD})"
    )
    p.add_argument("--seed", type=int, help="override the workload's seed")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, help="seconds of arrivals")
    length.add_argument("--requests", type=int, help="about this many requests (duration = N / rate)")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def _register_run(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="one mixed workload at one offered load: per-class table, JSONL, evidence",
        description="Send the workload's open-loop arrivals to a live router (--url, real time) "
        "or run it on the simulator's virtual clock behind a profile (--virtual --profile). "
        "Prints per-class TTFT/ITL/e2e, SLO attainment and goodput; writes every request to "
        "JSONL. Exit 0 when every class passes the gate, 1 when one fails.",
    )
    run.add_argument("--url", help="router base URL, e.g. http://127.0.0.1:8080")
    run.add_argument("--key", help="API key for the router")
    run.add_argument("--rate", type=float, required=True, help="offered load, requests/s")
    _workload_args(run)
    run.add_argument("--profile", type=Path, help="the router's profile (model, evidence, --virtual)")
    run.add_argument("--virtual", action="store_true", help="virtual clock on simulated engines")
    run.add_argument("--engines", type=int, help="--virtual: total engines (default: the profile's)")
    run.add_argument("--preset", default=DEFAULT_PRESET, help="--virtual: simulator preset")
    run.add_argument("--model", help="model to ask for (default: the profile's, else the first served)")
    run.add_argument("--out", type=Path, help="JSONL file (default: bench-<workload>-<rate>-<time>.jsonl)")
    run.add_argument("--evidence", type=Path, help="write one capacity evidence record per lane here")
    run.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="seconds of unmeasured load first (evidence: warmup done vs skipped)",
    )
    run.add_argument("--drain", type=float, default=180.0, help="seconds to wait for answers at the end")
    run.set_defaults(func=cmd_run)


def _register_compare(sub: Any) -> None:
    compare = sub.add_parser(
        "compare",
        help="the same workload against several profiles, side by side (tables, JSON, plots)",
        description="Run one seeded workload against each profile with the same total number of "
        "engines, at one offered load (--rate) or a sweep (--sweep 5,10,20 or 5:40:5). Writes "
        "report.md, results.json and PNG plots to --out.",
    )
    compare.add_argument("--profiles", type=Path, nargs="+", required=True)
    load = compare.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="one offered load, requests/s")
    load.add_argument("--sweep", help="offered loads: a list (5,10,20) or a range (5:40:5)")
    _workload_args(compare)
    compare.add_argument("--mode", choices=["virtual", "realtime"], default="virtual")
    compare.add_argument(
        "--engines", type=int, help="total engines per profile (default: each profile's own)"
    )
    compare.add_argument(
        "--preset", default=DEFAULT_PRESET, help=f"simulator preset (default {DEFAULT_PRESET})"
    )
    compare.add_argument("--jobs", type=int, default=1, help="virtual mode: points run in parallel")
    compare.add_argument("--out", type=Path, default=Path("lab-results"), help="output directory")
    compare.add_argument("--plot-rate", type=float, help="offered load of the per-class plots")
    compare.add_argument(
        "--pool-engines",
        action="append",
        default=[],
        metavar="POOL=N",
        help="give pools of this name N engines in every profile that has one; the others share the "
        "rest of --engines in proportion (repeatable)",
    )
    compare.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="change a setting of every profile for this run (repeatable; dotted PATH, * for "
        "every key), e.g. 'pools.*.vllm.max_model_len=32768' or slow_clients.lag_bytes=16384",
    )
    compare.set_defaults(func=cmd_compare)
    plot = sub.add_parser(
        "plot",
        help="redraw report.md and the plots of a comparison from its results.json",
        description="Read results.json files written by `bench compare` and write report.md and the "
        "PNG plots again (e.g. at another --plot-rate, or several runs side by side), without "
        "running anything.",
    )
    plot.add_argument(
        "results",
        type=Path,
        nargs="+",
        help="results.json of a comparison; several (of one workload) are merged, a repeated profile "
        "name taking its directory's name as a suffix",
    )
    plot.add_argument("--out", type=Path, help="output directory (default: beside the first results.json)")
    plot.add_argument("--plot-rate", type=float, help="offered load of the per-class plots")
    plot.set_defaults(func=cmd_plot)


def parse_rates(text: str) -> tuple[float, ...]:
    """`5,10,20` or `start:stop:step` (stop included)."""
    if ":" in text:
        start, stop, step = (float(x) for x in text.split(":"))
        if step <= 0 or stop < start:
            raise ValueError(f"bad range {text!r}")
        count = round((stop - start) / step) + 1
        return tuple(round(start + i * step, 9) for i in range(count))
    rates = tuple(float(x) for x in text.split(",") if x.strip())
    if not rates:
        raise ValueError(f"no rates in {text!r}")
    return rates


def _duration(args: argparse.Namespace, rate: float) -> float:
    if args.requests is not None:
        return float(args.requests) / rate
    return float(args.duration) if args.duration is not None else 60.0


def _fail(err: Exception) -> int:
    print(f"lane-router bench: {err}", file=sys.stderr)
    return 2


def cmd_overhead(args: argparse.Namespace) -> int:
    from router.lab.bench.overhead import render, run

    if args.workers is not None:
        from router.lab.bench import workers_overhead

        totals = workers_overhead.run(args.workers, args.scale, max(1, args.rounds))
        print(workers_overhead.render(args.workers, totals))
        return 0 if all(t.errors == 0 for t in totals.values()) else 1
    from router.lab.bench.overhead import FRESH, SCENARIOS

    rows = run(scale=args.scale, scenarios=FRESH if args.new_connections else SCENARIOS, tls=args.tls)
    print(render(rows))
    return 0 if all(r.routed.errors == 0 and r.direct.errors == 0 for r in rows) else 1


def cmd_run(args: argparse.Namespace) -> int:
    from router.config.load import ConfigError
    from router.lab.bench.runcmd import RunArgs, run

    try:
        return run(
            RunArgs(
                workload=args.workload,
                rate=args.rate,
                duration=_duration(args, args.rate),
                url=args.url,
                key=args.key,
                profile=args.profile,
                virtual=args.virtual,
                engines=args.engines,
                preset=args.preset,
                model=args.model,
                seed=args.seed,
                out=args.out,
                evidence=args.evidence,
                warmup=args.warmup,
                drain=args.drain,
                progress=args.progress,
            )
        )
    except (ConfigError, ValueError, OSError) as err:
        return _fail(err)


def cmd_compare(args: argparse.Namespace) -> int:
    from router.config.load import ConfigError
    from router.lab.bench.compare import CompareSpec
    from router.lab.bench.comparecmd import compare_and_write
    from router.lab.bench.profiles import parse_override

    try:
        spec = CompareSpec(
            workload_path=args.workload,
            profile_paths=tuple(args.profiles),
            rates=(args.rate,) if args.rate is not None else parse_rates(args.sweep),
            duration=None if args.requests is not None else (args.duration or 60.0),
            requests=args.requests,
            engines=args.engines,
            preset=args.preset,
            mode=args.mode,
            seed=args.seed,
            jobs=args.jobs,
            sets=tuple(parse_override(o) for o in args.sets),
            pool_engines=tuple((k, int(v)) for k, v in map(parse_override, args.pool_engines)),
            progress=args.progress,
        )
        command = " ".join(["lane-router", *sys.argv[1:]])
        return compare_and_write(spec, args.out, args.plot_rate, command)
    except (ConfigError, ValueError, OSError) as err:
        return _fail(err)


def cmd_plot(args: argparse.Namespace) -> int:
    from router.lab.bench.comparecmd import replot

    try:
        return replot(args.results, args.out, args.plot_rate)
    except (ValueError, KeyError, OSError) as err:
        return _fail(err)


def cmd_lanes(args: argparse.Namespace) -> int:
    from router.lab.bench.lanepolicies import run_experiments

    return run_experiments(args.experiments, args.duration)


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in TENANT_MODES]
    if unknown or not modes:
        raise ValueError(f"--modes: {', '.join(unknown) or 'none'} (choose from {', '.join(TENANT_MODES)})")
    return modes


def cmd_tenants(args: argparse.Namespace) -> int:
    from router.config.load import ConfigError, parse_profile
    from router.lab.bench.tenants import lab_profile_data, run_mode, table_md, tenant_trace, write_results
    from router.lab.bench.workload import load_workload
    from router.lab.sim.timing import load_preset

    try:
        modes = parse_modes(args.modes)
        workload = load_workload(args.workload)
        data, source = lab_profile_data(args.profile)
        cfg = parse_profile(data, source)
        trace = tenant_trace(workload, cfg, rate=args.rate, duration=args.duration, seed=args.seed)
        if args.realtime:
            from router.lab.bench.tenantsreal import run_mode_realtime

            runs = [run_mode_realtime(trace, data, args.preset, m, progress=args.progress) for m in modes]
        else:
            preset = load_preset(args.preset)
            runs = [run_mode(trace, cfg, preset, m, progress=args.progress) for m in modes]
        command = " ".join(["lane-router", *sys.argv[1:]])
        paths = write_results(workload, args.rate, runs, args.out, command)
    except (ConfigError, ValueError, OSError, RuntimeError) as err:
        return _fail(err)
    print(table_md(workload, args.rate, runs))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_prefix(args: argparse.Namespace) -> int:
    from router.config.load import ConfigError
    from router.lab.bench.prefix import pick_scenarios, pick_strategies, run_all, table_md, write_results
    from router.lab.sim.timing import load_preset

    try:
        scenarios = pick_scenarios(args.scenarios)
        strategies = pick_strategies(args.strategies)
        runs = run_all(
            scenarios,
            strategies,
            load_preset(args.preset),
            workloads=args.workloads,
            duration=args.duration,
            delay=args.delay_ms / 1000.0,
            seed=args.seed,
            progress=args.progress,
        )
        command = " ".join(["lane-router", *sys.argv[1:]])
        paths = write_results(runs, args.out, command)
    except (ConfigError, ValueError, OSError) as err:
        return _fail(err)
    print(table_md(runs))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from router.lab.bench.demo import run_demo

    try:
        return run_demo(rate=args.rate, duration=args.duration, out=args.out, progress=args.progress)
    except (ValueError, OSError, RuntimeError) as err:
        print(f"lane-router demo: {err}", file=sys.stderr)
        return 1
