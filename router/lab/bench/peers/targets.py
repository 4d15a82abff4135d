"""The targets of the peers benchmark and how each proxy is started, pinned to the proxy core.

lane-router runs with every feature on as in production — its key checked, requests classified,
metrics kept, pool admission, a per-key rate limit counted in memory, the slow-client watch — on
the overhead benchmark's profile (`bench_profile`) with the shared-state benchmark's limits, far
above the load so nothing is refused. Its source tree can be another checkout (`src`), so two
trees are compared in one run; the fake backends always come from this one."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from router.lab.bench.overhead import bench_profile
from router.lab.bench.peers import nginx
from router.lab.bench.sharedstate_overhead import LIMITS

Kind = Literal["lane-router", "vllm-router", "nginx", "bare", "direct"]
KINDS: tuple[Kind, ...] = ("lane-router", "vllm-router", "nginx", "bare", "direct")
LABELS: dict[Kind, str] = {
    "lane-router": "lane-router",
    "vllm-router": "vLLM Router",
    "nginx": "nginx",
    "bare": "bare Python",
    "direct": "direct",
}
# Admission far above the 64 streams of the paced scenario: counted, never waited on.
ADMISSION = {"max_prefilling": 256}


@dataclass(frozen=True, slots=True)
class Target:
    kind: Kind
    label: str
    src: Path | None = None  # lane-router: the source tree on PYTHONPATH


@dataclass(frozen=True, slots=True)
class Tools:
    """Where the peers' executables are (a missing one is reported, its column left empty)."""

    python: str
    vllm_router: str
    nginx: str
    wrk: str | None  # None: the non-streamed scenario uses loadgen too


@dataclass(frozen=True, slots=True)
class Launch:
    args: list[str]
    env: dict[str, str]

    def shown(self) -> str:
        """The command as a shell line (PYTHONPATH included, the rest of the environment not)."""
        return " ".join([*(f"{k}={v}" for k, v in self.env.items()), *self.args])


def lane_router_targets(srcs: list[Path], here: Path) -> list[Target]:
    """One target per source tree; labelled by the tree's commit when there are several."""
    if not srcs:
        return [Target("lane-router", "lane-router", here)]
    if len(srcs) == 1:
        return [Target("lane-router", "lane-router", srcs[0].resolve())]
    names = [_tree_name(src) for src in srcs]
    # Two checkouts of one commit (one with changes not committed) still get a column each.
    names = [f"{name} ({i})" if names.count(name) > 1 else name for i, name in enumerate(names, 1)]
    return [
        Target("lane-router", f"lane-router {name}", src.resolve())
        for name, src in zip(names, srcs, strict=True)
    ]


def _tree_name(src: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or src.resolve().name


def missing(target: Target, tools: Tools) -> str | None:
    """Why `target` cannot run here, or None."""
    if target.kind == "vllm-router" and not _executable(tools.vllm_router):
        return f"not installed ({tools.vllm_router})"
    if target.kind == "nginx" and not _executable(tools.nginx):
        return f"not installed ({tools.nginx})"
    if target.kind == "lane-router" and not (target.src and (target.src / "router" / "__init__.py").exists()):
        return f"no router package under {target.src}"
    return None


def _executable(path: str) -> bool:
    found = shutil.which(path)
    return found is not None and os.access(found, os.X_OK)


def lane_router_profile(backend: str, key: str) -> dict[str, Any]:
    data = bench_profile(backend, key, LIMITS)
    for pool in data["pools"].values():
        pool["admission"] = dict(ADMISSION)
    return data


@dataclass(frozen=True, slots=True)
class Where:
    """Where one proxy instance listens and what it forwards to."""

    port: int
    backend_port: int
    run_dir: Path
    cpu: int | None  # None: not pinned
    key: str
    metrics_port: int  # vLLM Router always opens a Prometheus listener


def launch(target: Target, tools: Tools, where: Where) -> Launch:
    upstream = f"127.0.0.1:{where.backend_port}"
    if target.kind == "lane-router":
        launched = _lane_router(target, tools, where, upstream)
    elif target.kind == "vllm-router":
        launched = _vllm_router(tools, where, upstream)
    elif target.kind == "nginx":
        conf = nginx.write_config(
            where.run_dir / f"nginx-{where.port}", where.port, [upstream], where.cpu or 0
        )
        launched = Launch(nginx.command(tools.nginx, conf), {})
    elif target.kind == "bare":
        bare = ["-m", "router.lab.bench.peers.bare_proxy", "--port", str(where.port), "--upstream", upstream]
        launched = Launch([tools.python, *bare], {})
    else:
        raise ValueError(f"{target.kind} has no process")
    pin = [] if where.cpu is None else ["taskset", "-c", str(where.cpu)]
    return Launch([*pin, *launched.args], launched.env)


def _lane_router(target: Target, tools: Tools, where: Where, upstream: str) -> Launch:
    cfg = where.run_dir / f"lane-router-{where.port}.yaml"
    cfg.write_text(yaml.safe_dump(lane_router_profile(f"http://{upstream}", where.key)))
    # -P: the working directory, which may be another checkout, must not come before PYTHONPATH.
    serve = [
        "-P",
        "-m",
        "router",
        "serve",
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(where.port),
    ]
    return Launch([tools.python, *serve, "--log-level", "warning"], {"PYTHONPATH": str(target.src)})


def _vllm_router(tools: Tools, where: Where, upstream: str) -> Launch:
    # One tokio worker, as the other proxies have one event loop (unset, it is one per CPU of
    # its affinity mask); it has no flag for it.
    env = {"TOKIO_WORKER_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    args = [tools.vllm_router, "--host", "127.0.0.1", "--port", str(where.port)]
    args += ["--worker-urls", f"http://{upstream}", "--policy", "round_robin"]
    args += ["--prometheus-port", str(where.metrics_port), "--log-level", "warning"]
    return Launch(args, env)
