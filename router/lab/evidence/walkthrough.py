"""`lane-router evidence example`: the worked example of docs/evidence.md, run for real.

Config A is started on the simulator behind the router and measured by `lane-router bench run
--evidence`; `check --evidence` decides each lane and `serve --require-evidence` starts. Config B
changes the interactive pool: its lanes DEFER, naming the retest triggers that fired, and `serve
--require-evidence` refuses, until B is measured in turn; `evidence diff` compares the two chat
records. Every step is a `lane-router` command run as its own process and printed before it
runs; everything listens on 127.0.0.1 and is stopped before this returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from router.config.load import load_profile
from router.evidence.cli import parse_slo
from router.evidence.identity import serving_configuration
from router.evidence.store import EvidenceStore
from router.evidence.verdicts import LaneVerdict, lane_verdicts
from router.keys.auth import hash_key, new_key
from router.lab.bench.stack import backend_ports, wait_ready
from router.lab.evidence.example import BULK, INTERACTIVE, example_profile, example_workload
from router.lab.procs import child_process, free_ports

READY_TIMEOUT_S = 30.0
PROGRAM = "lane-router"


@dataclass(frozen=True, slots=True)
class Scale:
    """How long and how hard each measurement runs."""

    rate: float = 2.5
    duration: float = 24.0
    warmup: float = 3.0
    drain: float = 60.0
    preset: str = "h100-llama3-8b"
    slo: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Paths:
    """Where the example writes: both profiles, the workload, the key, the evidence store, logs."""

    root: Path
    profile_a: Path
    profile_b: Path
    workload: Path
    key: Path
    evidence: Path
    logs: Path

    @classmethod
    def under(cls, root: Path) -> Paths:
        names = ("profile-a.yaml", "profile-b.yaml", "workload.yaml", "bench.key", "evidence", "logs")
        return cls(root, *(root / name for name in names))


@dataclass(frozen=True, slots=True)
class Ran:
    """One command of the example: what ran, its exit status and what it printed."""

    argv: tuple[str, ...]
    code: int
    output: str


@dataclass(slots=True)
class Outcome:
    """What the example found, step by step, for its summary and for tests."""

    a_measured: Ran | None = None
    a_checked: list[LaneVerdict] = field(default_factory=list)
    a_served: Ran | None = None
    a_wider: Ran | None = None
    b_checked: list[LaneVerdict] = field(default_factory=list)
    b_refused: Ran | None = None
    b_measured: Ran | None = None
    b_rechecked: list[LaneVerdict] = field(default_factory=list)
    diff: Ran | None = None


Printer = Callable[[str], None]


def prepare(paths: Paths, scale: Scale) -> None:
    """Write both profiles, the workload and a fresh bench key into `paths.root` (new or empty)."""
    if paths.root.exists() and any(paths.root.iterdir()):
        raise ValueError(f"{paths.root}: not empty; the example writes a fresh evidence store")
    paths.logs.mkdir(parents=True, exist_ok=True)
    key = "example-" + new_key()
    paths.key.write_text(key + "\n")
    paths.key.chmod(0o600)
    interactive, bulk = free_ports(2)
    ports = {INTERACTIVE: interactive, BULK: bulk}
    hardware = f"lane-router simulator, preset {scale.preset}"
    for config, path in (("A", paths.profile_a), ("B", paths.profile_b)):
        data = example_profile(config, ports=ports, key_sha256=hash_key(key), hardware=hardware)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    paths.workload.write_text(yaml.safe_dump(example_workload(), sort_keys=False))


def shown(argv: Sequence[str], paths: Paths) -> str:
    """The command as a person would type it (the key read from its file, not printed)."""
    words = [PROGRAM, *argv]
    key = paths.key.read_text().strip()
    text = " ".join(shlex.quote(w) for w in words)
    return text.replace(shlex.quote(key), f'"$(cat {shlex.quote(str(paths.key))})"')


def _command(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "router", *argv]


def run_command(argv: Sequence[str], paths: Paths, say: Printer, timeout: float = 60.0) -> Ran:
    say(f"$ {shown(argv, paths)}")
    done = subprocess.run(
        _command(argv), capture_output=True, text=True, timeout=timeout, env=_env(), check=False
    )
    output = (done.stdout + done.stderr).rstrip()
    return Ran(tuple(argv), done.returncode, output)


@contextlib.contextmanager
def background(
    argv: Sequence[str], log: Path, paths: Paths, say: Printer
) -> Iterator[subprocess.Popen[bytes]]:
    """A long-running command (engines, router), its output in `log`; terminated on exit."""
    say(f"$ {shown(argv, paths)} &")
    with child_process(_command(argv), env=_env(), log=log, stdout_to_log=True) as proc:
        yield proc


def measure(profile: Path, tag: str, paths: Paths, scale: Scale, say: Printer) -> Ran:
    """Start `profile`'s simulated engines and the router, run the benchmark with --evidence, stop."""
    port = free_ports(1, avoid=backend_ports(load_profile(profile)))[0]
    url = f"http://127.0.0.1:{port}"
    sim_log, router_log = paths.logs / f"sim-{tag}.log", paths.logs / f"router-{tag}.log"
    sim_argv = ["sim", "--config", str(profile), "--preset", scale.preset]
    serve_argv = ["serve", "--config", str(profile), "--port", str(port), "--log-level", "warning"]
    with (
        background(sim_argv, sim_log, paths, say) as sim,
        background(serve_argv, router_log, paths, say) as router,
    ):
        asyncio.run(wait_ready(url, {sim_log: sim, router_log: router}, READY_TIMEOUT_S))
        bench = [
            *("bench", "run", "--url", url, "--key", paths.key.read_text().strip()),
            *("--profile", str(profile), "--workload", str(paths.workload)),
            *("--rate", f"{scale.rate:g}", "--duration", f"{scale.duration:g}"),
            *("--warmup", f"{scale.warmup:g}", "--drain", f"{scale.drain:g}"),
            *("--evidence", str(paths.evidence), "--out", str(paths.root / f"bench-{tag}.jsonl")),
            "--no-progress",
        ]
        limit = scale.warmup + scale.duration + 2 * scale.drain + 60.0
        ran = run_command(bench, paths, say, timeout=limit)
    say(ran.output)
    return ran


def check(profile: Path, paths: Paths, scale: Scale, say: Printer) -> list[LaneVerdict]:
    """`check --evidence`, printed from its evidence table on; the verdicts, as the library has them."""
    ran = run_command(["check", str(profile), "--evidence", str(paths.evidence), *_slo(scale)], paths, say)
    if ran.code not in (0, 1, 3):  # the worst lane's decision: PASS, CONDITIONAL, DEFER
        raise RuntimeError(f"check failed ({ran.code}): {ran.output}")
    say("  (lanes and pools summary left out)\n" + ran.output[ran.output.find("evidence:") :])
    return lane_verdicts(load_profile(profile), paths.evidence, parse_slo(scale.slo))


def serve_gated(profile: Path, paths: Paths, scale: Scale, say: Printer) -> Ran:
    """`serve --require-evidence`: stopped again once it answers /health, or its refusal."""
    port = free_ports(1, avoid=backend_ports(load_profile(profile)))[0]
    argv = [
        *("serve", "--config", str(profile), "--port", str(port), "--log-level", "warning"),
        *("--require-evidence", str(paths.evidence), *_slo(scale)),
    ]
    log = paths.logs / f"serve-gated-{profile.stem}.log"
    with background(argv, log, paths, say) as proc:
        answered = True
        try:
            asyncio.run(wait_ready(f"http://127.0.0.1:{port}", {log: proc}, READY_TIMEOUT_S, b"/health"))
        except RuntimeError:
            answered = False
        code = proc.poll()
    output = log.read_text(errors="replace").rstrip()
    if answered:
        say(f"{output}\n  (started: /health answered 200 on 127.0.0.1:{port}; stopped again)")
        return Ran(tuple(argv), 0, output)
    say(f"{output}\n  (exit status {code})")
    return Ran(tuple(argv), -1 if code is None else code, output)


def wider_target(paths: Paths, scale: Scale, say: Printer) -> Ran | None:
    """`evidence decide` for config A's chat lane at a larger shape and concurrency than measured."""
    pair = chat_records(paths, (paths.profile_a,))
    if pair is None:
        return None
    argv = [
        *("evidence", "decide", "--record", str(pair[0]), "--config", str(paths.profile_a)),
        *("--lane", "chat", "--max-input", "4096", "--max-output", "1024", "--concurrency", "12"),
        *_slo(scale),
    ]
    ran = run_command(argv, paths, say)
    say(f"{ran.output}\n  (exit status {ran.code})")
    return ran


def chat_records(paths: Paths, profiles: Sequence[Path] = ()) -> tuple[Path, ...] | None:
    """The interactive pool's newest record under each profile (default: config A, then B)."""
    store = EvidenceStore(paths.evidence)
    found: list[Path] = []
    for profile in profiles or (paths.profile_a, paths.profile_b):
        wanted = serving_configuration(load_profile(profile).pools[INTERACTIVE]).identity
        matching = [
            r for r in store if r.identity.server_configuration_hash == wanted.server_configuration_hash
        ]
        if not matching:
            return None
        found.append(store.path_for(matching[-1]))
    return tuple(found)


def run_example(paths: Paths, scale: Scale, say: Printer = print) -> Outcome:
    prepare(paths, scale)
    outcome = Outcome()
    say(f"# 1. Measure config A: {paths.profile_a}")
    outcome.a_measured = measure(paths.profile_a, "a", paths, scale, say)
    say("\n# 2. Decide config A's lanes on the evidence")
    outcome.a_checked = check(paths.profile_a, paths, scale, say)
    say("\n# 3. Start the router on config A, gated by the evidence")
    outcome.a_served = serve_gated(paths.profile_a, paths, scale, say)
    say("\n# 4. A larger target than config A's chat lane was measured for: 4096/1024 at 12")
    outcome.a_wider = wider_target(paths, scale, say)
    say(f"\n# 5. Config B changes the interactive pool: {paths.profile_b}")
    outcome.b_checked = check(paths.profile_b, paths, scale, say)
    say("\n# 6. The gate refuses config B")
    outcome.b_refused = serve_gated(paths.profile_b, paths, scale, say)
    say("\n# 7. Measure config B")
    outcome.b_measured = measure(paths.profile_b, "b", paths, scale, say)
    outcome.b_rechecked = check(paths.profile_b, paths, scale, say)
    say("\n# 8. What differs between the two chat records")
    pair = chat_records(paths)
    if pair is not None:
        outcome.diff = run_command(["evidence", "diff", str(pair[0]), str(pair[1])], paths, say)
        say(outcome.diff.output)
    say("")
    show = run_command(["evidence", "show", str(paths.evidence)], paths, say)
    say(show.output)
    return outcome


def _slo(scale: Scale) -> list[str]:
    return [word for pair in scale.slo for word in ("--slo", pair)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def problems(outcome: Outcome) -> list[str]:
    """Where the run did not come out as the worked example describes (empty: it did)."""
    found: list[str] = []
    interactive_moved = ("config_hash", "parallelism", "max_model_len")
    for label, verdicts in (("config A", outcome.a_checked), ("config B, measured", outcome.b_rechecked)):
        found += [
            f"{label}: lane {v.cls.value} is {_verdict(v)}, not PASS"
            for v in verdicts
            if v.decision.final_decision != "PASS"
        ]
    for v in outcome.b_checked:
        if v.pool == INTERACTIVE and (
            v.decision.final_decision != "DEFER" or v.decision.triggers != interactive_moved
        ):
            found.append(
                f"config B: lane {v.cls.value} is {_verdict(v)}, not DEFER for {', '.join(interactive_moved)}"
            )
        if v.pool == BULK and v.decision.final_decision != "PASS":
            found.append(f"config B: unchanged lane {v.cls.value} is {_verdict(v)}, not PASS")
    if outcome.a_served is None or outcome.a_served.code != 0:
        found.append("config A: serve --require-evidence did not start")
    if outcome.a_wider is None or outcome.a_wider.code != 3 or "request_shape" not in outcome.a_wider.output:
        found.append("config A: a target of 4096/1024 tokens did not DEFER for request_shape")
    if outcome.b_refused is None or outcome.b_refused.code != 3:
        found.append("config B: serve --require-evidence did not refuse with exit status 3")
    if outcome.diff is None or outcome.diff.code != 1:
        found.append("no two chat records to compare")
    return found


def _verdict(v: LaneVerdict) -> str:
    d = v.decision
    detail = ", ".join([*d.triggers, *d.slo_misses])
    return f"{d.final_decision} ({d.reason_class}{': ' + detail if detail else ''})"
