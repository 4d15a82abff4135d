"""A profile made live on loopback: simulated vLLM engines and the router in front of them.

The router always runs as its own process (`lane-router serve`, exactly as deployed), with a
profile rewritten for the occasion: its keys replaced by one key made for this stack alone
(`router.keys.auth.new_key`), debug headers switched on so each answer names its lane, and prompts
counted as the simulated engines count them unless the profile says otherwise. The engines run
either in a process of their own (`local_stack`: `lane-router sim --config`, for the mixed-traffic
lab, whose load generator must not share a CPU budget with them) or in the caller's event loop
(`routed` over a `SimCluster`, for the lane-policy experiments, which read the engines' own
counters and when each answer left them). Everything started here is stopped when its block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from router.config.load import parse_profile
from router.config.models import ProfileConfig
from router.keys.auth import hash_key, new_key
from router.lab.bench.generate import Trace
from router.lab.bench.loadclient import Endpoint
from router.lab.bench.outcome import Outcome
from router.lab.bench.realtime import RealtimeOptions, run_realtime
from router.lab.bench.virtual import pool_counts
from router.lab.procs import child_process, free_ports
from router.proxy.upstream import UpstreamPool

READY_TIMEOUT_S = 30.0
# The one key of a stack; upstream, requests carry it as the prefix of their id (`bench:<id>`).
KEY_NAME = "bench"


@dataclass(frozen=True, slots=True)
class RouterProcess:
    url: str
    key: str
    pid: int

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, self.key)


@dataclass(frozen=True, slots=True)
class LocalStack:
    router: RouterProcess
    profile_path: Path
    config: ProfileConfig
    sim_pid: int

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def key(self) -> str:
        return self.router.key

    @property
    def endpoint(self) -> Endpoint:
        return self.router.endpoint


def keyed_profile(
    data: Mapping[str, Any], key: str, keys: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """`data` (a profile mapping) with one key, `key`, allowed every class and the metrics (and
    `keys`, entries of the profile's `keys:`, beside it), its debug headers on, and (unless it
    names a tokenizer) prompts counted as the simulator does."""
    out = copy.deepcopy(dict(data))
    out["keys"] = [{"name": KEY_NAME, "sha256": hash_key(key), "metrics": True}, *map(dict, keys)]
    out["debug_headers"] = True
    out.setdefault("tokenizer", "simulator")
    return out


def local_profile(
    data: Mapping[str, Any],
    key: str,
    engines: int | None = None,
    fixed: Mapping[str, int] | None = None,
    keys: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """`keyed_profile` with every pool's backends on free loopback ports (as many as the profile
    lists, or `engines` spread over the pools) and health probes every half second, so the router
    is ready quickly. The engines are simulated: the profile's own tokenizer belongs to the model
    its real servers run, so prompts are counted as the engines count them."""
    out = keyed_profile(data, key, keys)
    out["tokenizer"] = "simulator"
    counts = pool_counts(parse_profile(out, "profile"), engines, fixed)
    ports = iter(free_ports(sum(counts.values())))
    for name, pool in out["pools"].items():
        pool.pop("discovery", None)  # a pool found by DNS is simulated with listed engines
        pool["backends"] = [f"http://127.0.0.1:{next(ports)}" for _ in range(counts[name])]
    out["health"] = {**out.get("health", {}), "interval_s": 0.5, "timeout_s": 2.0}
    return out


def backend_ports(cfg: ProfileConfig) -> set[int]:
    """The ports of the backends `cfg` lists."""
    return {url.port for pool in cfg.pools.values() for url in pool.backends if url.port is not None}


async def wait_ready(
    url: str, procs: Mapping[Path, subprocess.Popen[bytes]], timeout: float, path: bytes = b"/ready"
) -> None:
    """Until the router at `url` answers `path` (/ready) with 200; a process of `procs` exiting
    first is an error that quotes the end of its log."""
    pool = UpstreamPool(url, connect_timeout=0.5, read_timeout=2.0)
    deadline = time.monotonic() + timeout
    try:
        while True:
            for log, proc in procs.items():
                if proc.poll() is not None:
                    tail = log.read_bytes()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"{log.stem} exited with {proc.returncode}: {tail}")
            with contextlib.suppress(Exception):
                resp = await pool.request(b"GET", path, [], b"")
                await resp.read()
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}{path.decode()} did not answer 200 within {timeout:g} s")
            await asyncio.sleep(0.1)
    finally:
        await pool.aclose()


def _python() -> list[str]:
    return [sys.executable, "-m", "router"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def _router_child(profile: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    serve = ["serve", "--config", str(profile), "--port", str(port), "--log-level", "warning"]
    with child_process([*_python(), *serve], env=_env(), log=log) as proc:
        yield proc


@contextlib.asynccontextmanager
async def routed(
    data: Mapping[str, Any], ready_timeout: float = READY_TIMEOUT_S
) -> AsyncIterator[RouterProcess]:
    """The router for the profile mapping `data` (its backends already running), with a fresh
    key; yields once it is ready."""
    key = new_key()
    port = free_ports(1)[0]
    with tempfile.TemporaryDirectory(prefix="lane-router-lab-") as tmp:
        path, log = Path(tmp) / "profile.yaml", Path(tmp) / "router.log"
        path.write_text(yaml.safe_dump(keyed_profile(data, key), sort_keys=False))
        with _router_child(path, port, log) as router:
            url = f"http://127.0.0.1:{port}"
            await wait_ready(url, {log: router}, ready_timeout)
            yield RouterProcess(url, key, router.pid)


@contextlib.contextmanager
def local_stack(
    data: Mapping[str, Any],
    preset: str,
    engines: int | None = None,
    fixed: Mapping[str, int] | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
    keys: Sequence[Mapping[str, Any]] = (),
) -> Iterator[LocalStack]:
    """Start engines (one process) and router for the profile mapping `data` (with `keys` beside
    the stack's own); yield once the router is ready."""
    key = new_key()
    live = local_profile(data, key, engines, fixed, keys)
    cfg = parse_profile(live, "local profile")
    port = free_ports(1, avoid=backend_ports(cfg))[0]  # the engines bind theirs while the router starts
    with tempfile.TemporaryDirectory(prefix="lane-router-lab-") as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_text(yaml.safe_dump(live, sort_keys=False))
        sim_log, router_log = Path(tmp) / "sim.log", Path(tmp) / "router.log"
        sim_args = [*_python(), "sim", "--config", str(path), "--preset", preset]
        with (
            child_process(sim_args, env=_env(), log=sim_log) as sim,
            _router_child(path, port, router_log) as router,
        ):
            url = f"http://127.0.0.1:{port}"
            asyncio.run(wait_ready(url, {sim_log: sim, router_log: router}, ready_timeout))
            yield LocalStack(RouterProcess(url, key, router.pid), path, cfg, sim.pid)


def run_on_local_stack(
    trace: Trace,
    data: Mapping[str, Any],
    preset: str,
    engines: int | None,
    fixed: Mapping[str, int] | None = None,
    *,
    progress: bool = True,
    desc: str = "bench",
) -> list[Outcome]:
    """Start `data`'s engines and router, run `trace` through the router in real time, stop all."""
    with local_stack(data, preset, engines, fixed) as stack:
        opts = RealtimeOptions(progress=progress, desc=desc)
        return asyncio.run(run_realtime(trace, stack.endpoint, opts))
