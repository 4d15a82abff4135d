"""A profile made live on loopback: simulated vLLM engines and the router in front of them, each
its own process, torn down on exit.

The profile is rewritten for the occasion: every pool's backends move to free local ports (as
many as the profile lists, or `engines` spread over the pools), the keys are replaced by one key
made for this stack alone (`LocalStack.key`), debug headers are switched on so each answer names
its lane, and health probes run every half second so the router is ready quickly.
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from router.auth import hash_key, new_key
from router.bench.client import Endpoint
from router.bench.generate import Trace
from router.bench.outcome import Outcome
from router.bench.realtime import RealtimeOptions, run_realtime
from router.bench.virtual import pool_counts
from router.config.load import parse_profile
from router.config.models import ProfileConfig
from router.procs import child_process, free_ports
from router.proxy.upstream import UpstreamPool

READY_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class LocalStack:
    url: str
    key: str
    profile_path: Path
    config: ProfileConfig
    sim_pid: int
    router_pid: int

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, self.key)


def local_profile(
    data: Mapping[str, Any], key: str, engines: int | None = None, fixed: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """`data` (a profile mapping) with its backends on free loopback ports and one bench key."""
    out = copy.deepcopy(dict(data))
    counts = pool_counts(parse_profile(out, "profile"), engines, fixed)
    ports = iter(free_ports(sum(counts.values())))
    for name, pool in out["pools"].items():
        pool["backends"] = [f"http://127.0.0.1:{next(ports)}" for _ in range(counts[name])]
    out["keys"] = [{"name": "bench", "sha256": hash_key(key)}]
    out["debug_headers"] = True
    # The engines are simulated: the router counts prompt tokens as they do (the profile's own
    # tokenizer belongs to the model its real servers run).
    out["tokenizer"] = "simulator"
    out["health"] = {**out.get("health", {}), "interval_s": 0.5, "timeout_s": 2.0}
    return out


async def wait_ready(url: str, procs: dict[Path, subprocess.Popen[bytes]], timeout: float) -> None:
    pool = UpstreamPool(url, connect_timeout=0.5, read_timeout=2.0)
    deadline = time.monotonic() + timeout
    try:
        while True:
            for log, proc in procs.items():
                if proc.poll() is not None:
                    tail = log.read_bytes()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"{log.stem} exited with {proc.returncode}: {tail}")
            with contextlib.suppress(Exception):
                resp = await pool.request(b"GET", b"/ready", [], b"")
                await resp.read()
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router at {url} was not ready within {timeout:g} s")
            await asyncio.sleep(0.1)
    finally:
        await pool.aclose()


@contextlib.contextmanager
def local_stack(
    data: Mapping[str, Any],
    preset: str,
    engines: int | None = None,
    fixed: Mapping[str, int] | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
) -> Iterator[LocalStack]:
    """Start engines and router for the profile mapping `data`; yield once the router is ready."""
    key = new_key()
    live = local_profile(data, key, engines, fixed)
    cfg = parse_profile(live, "local profile")
    port = free_ports(1)[0]
    py = [sys.executable, "-m", "router"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="lane-router-lab-") as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_text(yaml.safe_dump(live, sort_keys=False))
        sim_log, router_log = Path(tmp) / "sim.log", Path(tmp) / "router.log"
        with (
            child_process(
                [*py, "sim", "--config", str(path), "--preset", preset], env=env, log=sim_log
            ) as sim,
            child_process(
                [*py, "serve", "--config", str(path), "--port", str(port), "--log-level", "warning"],
                env=env,
                log=router_log,
            ) as router,
        ):
            url = f"http://127.0.0.1:{port}"
            asyncio.run(wait_ready(url, {sim_log: sim, router_log: router}, ready_timeout))
            yield LocalStack(url, key, path, cfg, sim.pid, router.pid)


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
