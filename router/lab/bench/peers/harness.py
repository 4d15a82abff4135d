"""The peers run: two fake backends on the load core (one answering at once, one paced at 20 ms
to the first token and 5 ms between tokens); for each backend, every proxy started at once, each
on the proxy core, in front of it; then rounds in which the targets take turns, each scenario's
load measured with the proxy's process-tree CPU time read before and after. The order of the
turns rotates from round to round and the figures are summed over the rounds, so drift of this
shared machine over the run falls on every target alike instead of on whichever ran last. With
`together`, each round runs a scenario's load through every target at once instead (one load
generator each, the proxies sharing their core), so what the machine does meanwhile falls on
all of them in the same seconds. A warm-up load precedes each target's first round. Every load
is bounded in time and request count, every process is stopped when its block ends, and
everything listens on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from router.lab.bench.peers import cpu, targets, wrk
from router.lab.bench.peers.scenarios import MODEL, Load, Measure, Scenario, TargetResult
from router.lab.bench.peers.targets import Target, Tools, Where
from router.lab.procs import child_process, free_ports

Progress = Callable[[str], None]
READY_S = 60.0  # vLLM Router waits for its worker's /health before it listens
MEASURED_FAILURES = (RuntimeError, subprocess.SubprocessError, OSError)


@dataclass(frozen=True, slots=True)
class Settings:
    targets: list[Target]
    scenarios: list[Scenario]
    duration_s: dict[str, float]  # per scenario name and round
    warmup_s: float
    tools: Tools
    run_dir: Path
    key: str
    proxy_cpu: int | None = 1
    load_cpu: int | None = 0
    max_requests: int = 1_000_000
    rounds: int = 3
    # Every target's load at once in each round instead of one after another: the targets share
    # the proxy core and whatever the machine does meanwhile, so its drift cancels in their ratio.
    together: bool = False


@dataclass
class Run:
    results: list[TargetResult] = field(default_factory=list)
    started: str = ""  # UTC
    load_start: str = ""
    load_end: str = ""
    commands: dict[str, str] = field(default_factory=dict)  # target label → one of its launches


@dataclass(frozen=True, slots=True)
class Running:
    """A target ready for load: where the loads go, and the processes whose CPU is its own."""

    target: Target
    port: int
    pids: list[int]


@dataclass
class _Tally:
    rounds: dict[str, dict[str, list[Measure]]]  # target label → scenario name → rounds
    why_not: dict[str, str] = field(default_factory=dict)  # target label → not installed, failed


def run(settings: Settings, progress: Progress) -> Run:
    out = Run(started=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), load_start=cpu.load_average())
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    tally = _Tally({t.label: {} for t in settings.targets})
    with _backends(settings) as backend_ports:
        for paced in (False, True):
            group = [s for s in settings.scenarios if s.paced == paced]
            if group:
                _run_group(group, backend_ports[paced], settings, tally, out.commands, progress)
    out.results = [
        TargetResult(t.label, tally.rounds[t.label], tally.why_not.get(t.label)) for t in settings.targets
    ]
    out.load_end = cpu.load_average()
    return out


def _run_group(
    group: list[Scenario],
    backend_port: int,
    settings: Settings,
    tally: _Tally,
    commands: dict[str, str],
    progress: Progress,
) -> None:
    """Start every target in front of `backend_port`, then measure `group` in rotating rounds."""
    with contextlib.ExitStack() as stack:
        ready = []
        for target in settings.targets:
            if target.label in tally.why_not:
                continue
            why = targets.missing(target, settings.tools)
            if why is not None:
                progress(f"{target.label}: skipped, {why}")
                tally.why_not[target.label] = why
                continue
            try:
                ready.append(_start(stack, target, settings, backend_port, commands))
            except MEASURED_FAILURES as err:
                progress(f"{target.label}: failed, {err}")
                tally.why_not[target.label] = f"failed: {err}"
        for turn in range(settings.rounds):
            progress(f"round {turn + 1} of {settings.rounds} (load average {cpu.load_average()})")
            if settings.together:
                _round_together(group, ready, settings, tally, progress, warm_up=turn == 0)
                continue
            shift = turn % len(ready) if ready else 0
            for running in ready[shift:] + ready[:shift]:
                for scenario in group:
                    _tally_one(scenario, running, settings, tally, progress, warm_up=turn == 0)


def _round_together(
    group: list[Scenario],
    ready: list[Running],
    settings: Settings,
    tally: _Tally,
    progress: Progress,
    *,
    warm_up: bool,
) -> None:
    """Each scenario's load through every target at once, one load generator each."""
    for scenario in group:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(ready))) as pool:
            loads = [
                pool.submit(_tally_one, scenario, running, settings, tally, progress, warm_up=warm_up)
                for running in ready
            ]
            for load in loads:
                load.result()  # what is not a measured failure is the harness's own: raise it


def _tally_one(
    scenario: Scenario,
    running: Running,
    settings: Settings,
    tally: _Tally,
    progress: Progress,
    *,
    warm_up: bool,
) -> None:
    """One target's measure of `scenario` into the tally; a target that fails is measured no more."""
    label = running.target.label
    if label in tally.why_not:
        return
    try:
        measure = _measure(scenario, running, settings, progress, warm_up=warm_up)
    except MEASURED_FAILURES as err:
        progress(f"{label}: failed, {err}")
        tally.why_not[label] = f"failed: {err}"
        return
    tally.rounds[label].setdefault(scenario.name, []).append(measure)


def _start(
    stack: contextlib.ExitStack,
    target: Target,
    settings: Settings,
    backend_port: int,
    commands: dict[str, str],
) -> Running:
    if target.kind == "direct":
        return Running(target, backend_port, [])
    port, metrics_port = free_ports(2)
    where = Where(
        port=port,
        backend_port=backend_port,
        run_dir=settings.run_dir,
        cpu=settings.proxy_cpu,
        key=settings.key,
        metrics_port=metrics_port,
    )
    launched = targets.launch(target, settings.tools, where)
    commands.setdefault(target.label, launched.shown())
    log = settings.run_dir / f"{target.kind}-{port}.log"
    env = {**os.environ, **launched.env}
    proc = stack.enter_context(child_process(launched.args, env=env, log=log, stdout_to_log=True))
    try:
        wait_ready(port, settings.key, proc)
    except RuntimeError as err:
        raise RuntimeError(f"{err} (log: {log})") from None
    return Running(target, port, cpu.process_tree(proc.pid))  # nginx's worker exists once it answers


@contextlib.contextmanager
def _backends(settings: Settings) -> Iterator[dict[bool, int]]:
    fast, paced = free_ports(2)
    module = [settings.tools.python, "-m", "router.lab.bench.zero_backend"]
    pin = _pin(settings.load_cpu)
    with (
        child_process([*pin, *module, "--port", str(fast)], log=settings.run_dir / "backend-fast.log"),
        child_process(
            [*pin, *module, "--port", str(paced), "--ttft-ms", "20", "--itl-ms", "5"],
            log=settings.run_dir / "backend-paced.log",
        ) as paced_proc,
    ):
        wait_ready(fast, settings.key, None)
        wait_ready(paced, settings.key, paced_proc)
        yield {False: fast, True: paced}


def _pin(cpu_id: int | None) -> list[str]:
    return [] if cpu_id is None else ["taskset", "-c", str(cpu_id)]


def wait_ready(port: int, key: str, proc: subprocess.Popen[bytes] | None, limit_s: float = READY_S) -> None:
    """Until a chat completion through `port` answers 200 (the same request the loads send)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before it answered")
        request = urllib.request.Request(url, data=body.encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)  # nothing to wait on but the port itself
    raise RuntimeError(f"not answering on port {port} after {limit_s:.0f} s")


def _measure(
    scenario: Scenario, running: Running, settings: Settings, progress: Progress, *, warm_up: bool
) -> Measure:
    duration = settings.duration_s[scenario.name]
    if warm_up and settings.warmup_s > 0:  # pools, caches, code paths: not measured
        _loadgen(scenario, running.port, settings, settings.warmup_s)
    progress(f"{running.target.label}: {scenario.title} ({duration:g} s)")
    started = time.monotonic()
    user, system = cpu.cpu_seconds(running.pids)
    load = _client(scenario, running.port, settings, duration)
    user_after, system_after = cpu.cpu_seconds(running.pids)
    window = (started, time.monotonic())
    if load.errors or load.bad_counts:
        progress(
            f"{running.target.label}: {scenario.title}: {load.errors} errors, {load.bad_counts} wrong counts"
        )
    if not running.pids:
        return Measure(load, None, window=window)
    return Measure(load, user_after - user + system_after - system, user_after - user, window)


def _client(scenario: Scenario, port: int, settings: Settings, duration: float) -> Load:
    if scenario.stream or settings.tools.wrk is None:
        return _loadgen(scenario, port, settings, duration)
    script = wrk.write_script(settings.run_dir / "post.lua", settings.key, scenario.tokens)
    seconds = max(1, round(duration))
    cmd = wrk.command(settings.tools.wrk, port, scenario.concurrency, seconds, script)
    return wrk.run([*_pin(settings.load_cpu), *cmd], seconds)


def _loadgen(scenario: Scenario, port: int, settings: Settings, duration: float) -> Load:
    cmd = [*_pin(settings.load_cpu), settings.tools.python, "-m", "router.lab.bench.peers.loadgen"]
    cmd += ["--port", str(port), "--key", settings.key, "--tokens", str(scenario.tokens)]
    cmd += ["--concurrency", str(scenario.concurrency), "--duration", str(duration)]
    cmd += ["--max-requests", str(settings.max_requests), "--stagger-ms", str(scenario.stagger_ms)]
    if scenario.stream:
        cmd.append("--stream")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr[-1000:]}")
    data = json.loads(done.stdout)
    return Load(
        requests=data["requests"],
        chunks=data["chunks"],
        errors=data["errors"],
        bad_counts=data["bad_counts"],
        elapsed_s=data["elapsed_s"],
        ttft_p50_ms=data.get("ttft_p50_ms"),
        ttft_p99_ms=data.get("ttft_p99_ms"),
    )
