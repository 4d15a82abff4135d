"""`lane-router sim …`: run simulated vLLM servers, or calibrate a preset against a real one."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.lab.sim.kv import LAYOUTS

DEFAULT_PRESET = "h100-llama3-8b"
# Scheduler limits of the calibrated server that no probe can observe: given on the command line.
_CALIBRATE_ENGINE_FLAGS = ("max_num_seqs", "max_num_batched_tokens")

# vLLM-style flags and the EngineConfig field each one sets.
_INT_FLAGS = {
    "--max-model-len": "max_model_len",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-num-seqs": "max_num_seqs",
    "--long-prefill-token-threshold": "long_prefill_token_threshold",
    "--stream-interval": "stream_interval",
    "--max-num-partial-prefills": "max_num_partial_prefills",
    "--max-long-partial-prefills": "max_long_partial_prefills",
    "--max-num-queued-reqs": "max_num_queued_reqs",
    "--block-size": "block_size",
    "--num-gpu-blocks-override": "num_gpu_blocks",
}


def configure(name: str, p: argparse.ArgumentParser) -> None:
    p.description = (
        "Serve simulated vLLM engines: one per --port/--ports, or every backend of a "
        "profile's pools with --config. Engine flags follow `vllm serve`."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, help="one server on this port")
    p.add_argument("--ports", help="several servers, e.g. 8101-8108 or 8101,8102")
    p.add_argument("--config", type=Path, help="a router profile: serve all of its backends")
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        help=f"timing and hardware preset, a name or a .yaml file (default {DEFAULT_PRESET})",
    )
    p.add_argument("--served-model-name", nargs="+", help="model names (default: the preset's)")
    p.add_argument("--api-key", help="require this key on /v1 routes, as vLLM does")
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters to serve, listed in /v1/models with the first served name as parent",
    )
    p.add_argument(
        "--runtime-lora-updating",
        action="store_true",
        help="serve /v1/load_lora_adapter and /v1/unload_lora_adapter "
        "(vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, also honoured here)",
    )
    for flag, field in _INT_FLAGS.items():
        p.add_argument(flag, dest=field, type=int)
    p.add_argument(
        "--enable-prefix-caching",
        dest="enable_prefix_caching",
        action=argparse.BooleanOptionalAction,
        default=None,
    )
    p.add_argument(
        "--enable-chunked-prefill",
        dest="enable_chunked_prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
    )
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"])
    p.add_argument("--kv-layout", choices=LAYOUTS, help="KV block allocation layout")
    p.add_argument("--vllm-version", dest="version", help="version reported on /version")
    p.add_argument(
        "--kv-events-config",
        help="publish KV cache events as vLLM does, e.g. "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558"}\'; several servers take consecutive ports',
    )
    p.set_defaults(func=cmd_serve)
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    cal = sub.add_parser(
        "calibrate",
        help="fit the step-time model to a running vLLM and write a preset",
        description="Send probe requests to an OpenAI-compatible server, fit the step-time "
        "coefficients and write a preset file usable with --preset.",
    )
    cal.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    cal.add_argument("--api-key", dest="cal_api_key")
    cal.add_argument("--model", help="model name (default: the first of /v1/models)")
    cal.add_argument("--out", type=Path, required=True, help="preset file to write")
    cal.add_argument("--name", help="preset name (default: the file's stem)")
    cal.add_argument("--quick", action="store_true", help="fewer, shorter probes")
    for field in _CALIBRATE_ENGINE_FLAGS:
        cal.add_argument(
            "--" + field.replace("_", "-"),
            dest=f"cal_{field}",
            type=int,
            help="as the server was started (no probe can see it); recorded in the preset",
        )
    cal.add_argument(
        "--note",
        action="append",
        default=[],
        help="a line for the preset's comment block, e.g. how the server was started (repeatable)",
    )
    cal.set_defaults(func=cmd_calibrate)
    cmp_ = sub.add_parser(
        "compare",
        help="run one workload against a real vLLM and a simulator, compare",
        description="Send the same seeded workload to both servers, one concurrency level at a "
        "time (real first, then the simulator). `latency`: prompts 50-1,500 tokens, outputs "
        "16-256; compares TTFT/ITL p50/p95 (within 25 %% by default). `prefix`: 5 documents x "
        "several questions; compares the prefix-cache hit rate (within 10 points). Prints a "
        "Markdown table; exit 0 when every metric is within tolerance.",
    )
    cmp_.add_argument("--real", required=True, help="base URL of the real vLLM")
    cmp_.add_argument("--sim", required=True, help="base URL of the simulator")
    cmp_.add_argument("--real-api-key")
    cmp_.add_argument("--sim-api-key")
    cmp_.add_argument("--workload", choices=["latency", "prefix"], default="latency")
    cmp_.add_argument(
        "--requests",
        type=int,
        default=160,
        help="requests per concurrency level (the p95 of fewer moves a lot between runs)",
    )
    cmp_.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    cmp_.add_argument("--seed", type=int, default=0, help="draws the lengths of the workload")
    cmp_.add_argument(
        "--salt",
        type=int,
        help="draws the prompts' token ids (default: new each run, so a real server that served "
        "an earlier run has none of them in its prefix cache)",
    )
    cmp_.add_argument("--tolerance", type=float, default=0.25, help="relative, for latencies")
    cmp_.add_argument("--hit-rate-points", type=float, default=10.0)
    cmp_.set_defaults(func=cmd_compare)


def parse_ports(text: str) -> list[int]:
    ports: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        ports.extend(range(int(lo), int(hi or lo) + 1))
    if not ports:
        raise ValueError(f"no ports in {text!r}")
    return ports


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = [
        *_INT_FLAGS.values(),
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "scheduling_policy",
        "kv_layout",
        "version",
    ]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def lora_modules(items: list[str]) -> tuple[tuple[str, str], ...]:
    """`--lora-modules name=path ...`, as vLLM takes them (the JSON form is not taken)."""
    found = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules takes NAME=PATH, not {item!r}")
        found.append((name, path))
    return tuple(found)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def build_specs(args: argparse.Namespace) -> list[Any]:
    specs = _engine_specs(args)
    if getattr(args, "kv_events_config", None) is None:
        return specs
    from router.lab.sim.kv_publisher import KVEventsConfig

    try:
        kv_events = KVEventsConfig.from_json(args.kv_events_config)
    except ValueError as err:  # a JSON or a validation error
        raise ValueError(f"--kv-events-config: {err}") from err
    return [dataclasses.replace(s, kv_events=kv_events.for_server(i)) for i, s in enumerate(specs)]


def _engine_specs(args: argparse.Namespace) -> list[Any]:
    from router.lab.sim.profile import engine_config
    from router.lab.sim.serve import EngineSpec
    from router.lab.sim.server import ServerSettings
    from router.lab.sim.timing import load_preset

    preset = load_preset(args.preset)
    if args.config is not None:
        from router.config.load import load_profile
        from router.lab.sim.profile import profile_specs

        return profile_specs(load_profile(args.config), preset, **_overrides(args))
    if args.port is None and args.ports is None:
        raise ValueError("give --port, --ports or --config")
    ports = [args.port] if args.port is not None else parse_ports(args.ports)
    config = engine_config(preset, {}, **_overrides(args))
    names = tuple(args.served_model_name or (preset.model,))
    settings = ServerSettings(
        served_model_names=names,
        api_key=args.api_key,
        lora_modules=lora_modules(args.lora_modules),
        runtime_lora=args.runtime_lora_updating or _env_flag("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
    )
    return [
        EngineSpec(port=p, config=config, timing=preset.timing, settings=settings, host=args.host)
        for p in ports
    ]


def cmd_serve(args: argparse.Namespace) -> int:
    from router.config.load import ConfigError

    try:
        specs = build_specs(args)
    except (ValueError, OSError, ConfigError) as err:
        print(f"lane-router sim: {err}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve(specs))
    except OSError as err:
        print(f"lane-router sim: {err}", file=sys.stderr)
        return 1
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: its socket writes cost a fraction of asyncio's per SSE chunk."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def _serve(specs: list[Any]) -> None:
    from router.lab.sim.serve import SimCluster

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with SimCluster(specs) as cluster:
        for spec, url in zip(specs, cluster.urls, strict=True):
            names = ",".join(spec.settings.served_model_names)
            print(f"simulated vLLM {spec.config.version} at {url} serving {names}", flush=True)
        await stop.wait()


def cmd_calibrate(args: argparse.Namespace) -> int:
    from router.lab.sim.calibrate import calibrate_to_file
    from router.lab.sim.fitting import CalibrationError

    try:
        preset = asyncio.run(
            calibrate_to_file(
                args.url,
                args.out,
                api_key=args.cal_api_key,
                model=args.model,
                name=args.name or args.out.stem,
                quick=args.quick,
                command=" ".join(["lane-router", "sim", "calibrate", *_calibrate_argv(args)]),
                notes=args.note,
                engine_flags=_calibrate_engine_flags(args),
            )
        )
    except CalibrationError as err:
        print(f"lane-router sim calibrate: {err}", file=sys.stderr)
        return 1
    t = preset.timing
    print(
        f"wrote {args.out}: c0={t.c0:.6g} c_prefill={t.c_prefill:.6g} "
        f"c_decode={t.c_decode:.6g} c_ctx={t.c_ctx:.6g} c_attn={t.c_attn:.6g} "
        f"frontend_s={t.frontend_s:.6g} frontend_request_s={t.frontend_request_s:.6g} "
        f"frontend_prompt_token_s={t.frontend_prompt_token_s:.6g} "
        f"frontend_output_token_s={t.frontend_output_token_s:.6g}"
    )
    return 0


def _calibrate_argv(args: argparse.Namespace) -> list[str]:
    """The calibrate command line as given, without the key and notes (recorded in the preset)."""
    argv = ["--url", args.url, "--out", str(args.out)]
    if args.model:
        argv += ["--model", args.model]
    if args.name:
        argv += ["--name", args.name]
    for field, value in _calibrate_engine_flags(args).items():
        argv += ["--" + field.replace("_", "-"), str(value)]
    return argv + (["--quick"] if args.quick else [])


def _calibrate_engine_flags(args: argparse.Namespace) -> dict[str, int]:
    given = {n: getattr(args, f"cal_{n}", None) for n in _CALIBRATE_ENGINE_FLAGS}
    return {n: v for n, v in given.items() if v is not None}


def cmd_compare(args: argparse.Namespace) -> int:
    from router.lab.sim.compare import compare_levels, format_levels
    from router.lab.sim.timedstream import StreamError

    try:
        levels = asyncio.run(
            compare_levels(
                args.real,
                args.sim,
                workload=args.workload,
                levels=args.concurrency,
                requests=args.requests,
                seed=args.seed,
                salt=args.salt,
                real_api_key=args.real_api_key,
                sim_api_key=args.sim_api_key,
                latency_tolerance=args.tolerance,
                hit_rate_points=args.hit_rate_points,
            )
        )
    except (OSError, StreamError, ValueError) as err:
        print(f"lane-router sim compare: {err}", file=sys.stderr)
        return 1
    print(format_levels(levels))
    return 0 if all(c.ok for level in levels for c in level.checks) else 1
