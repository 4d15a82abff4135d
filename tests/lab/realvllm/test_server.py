"""The server handle's process management, against a stand-in server (no vLLM needed)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from router.lab.procs import free_ports
from router.lab.realvllm.server import (
    VllmServer,
    VllmStartError,
    server_command,
    server_env,
)

FAKE = Path(__file__).with_name("fake_vllm.py")


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    python.chmod(0o755)
    return venv


def make_server(tmp_path: Path, venv: Path, mode: str) -> VllmServer:
    environ = dict(os.environ, FAKE_VLLM_MODE=mode, FAKE_VLLM_CHILD_PID_FILE=str(tmp_path / "child"))
    return VllmServer(
        venv=venv, model=tmp_path / "model", port=free_ports(1)[0], api_key="k",
        workdir=tmp_path / "work", cache=tmp_path / "cache", environ=environ,
    )  # fmt: skip


@pytest.fixture
def started(tmp_path: Path, fake_venv: Path, request: pytest.FixtureRequest) -> Iterator[VllmServer]:
    server = make_server(tmp_path, fake_venv, request.param)
    try:
        server.start()
        yield server
    finally:
        server.stop(grace=1.0)


def child_pid(tmp_path: Path) -> int:
    path = tmp_path / "child"
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "stand-in server never started its child"
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.parametrize("started", ["ok"], indirect=True)
def test_healthy_then_stop_kills_whole_group(started: VllmServer, tmp_path: Path) -> None:
    waited = started.wait_healthy(timeout=20)
    assert waited < 20
    assert httpx.get(f"{started.url}/health").status_code == 200
    assert started.memory_bytes() > 0
    leader, child = started.pid, child_pid(tmp_path)
    assert leader is not None
    started.stop(grace=5)
    assert not started.running()
    assert wait_gone(child), "engine child survived stop()"
    assert started.stop() is not None  # repeating is harmless


@pytest.mark.parametrize("started", ["ok"], indirect=True)
def test_server_leads_its_group_inside_our_session(started: VllmServer) -> None:
    # A session of its own would give the engine a scheduling group of its own (see the module).
    pid = started.pid
    assert pid is not None
    assert os.getpgid(pid) == pid
    assert os.getsid(pid) == os.getsid(0)


@pytest.mark.parametrize("started", ["crash"], indirect=True)
def test_exit_before_healthy_raises_with_log_tail(started: VllmServer) -> None:
    with pytest.raises(VllmStartError, match="exited with code 3") as info:
        started.wait_healthy(timeout=20)
    assert "engine core failed to start" in str(info.value)


@pytest.mark.parametrize("started", ["silent"], indirect=True)
def test_timeout_raises_with_log_tail(started: VllmServer) -> None:
    with pytest.raises(VllmStartError, match="not healthy after") as info:
        started.wait_healthy(timeout=1.0, poll=0.1)
    assert "fake vllm mode=silent" in str(info.value)


@pytest.mark.parametrize("started", ["stubborn"], indirect=True)
def test_sigterm_ignored_escalates_to_sigkill(started: VllmServer, tmp_path: Path) -> None:
    started.wait_healthy(timeout=20)
    child = child_pid(tmp_path)
    began = time.monotonic()
    code = started.stop(grace=0.5)
    assert code == -9
    assert time.monotonic() - began < 5
    assert wait_gone(child)


def test_context_manager_stops_on_error(tmp_path: Path, fake_venv: Path) -> None:
    server = make_server(tmp_path, fake_venv, "ok")
    with pytest.raises(KeyError), server:
        server.wait_healthy(timeout=20)
        raise KeyError("boom")
    assert not server.running()
    assert wait_gone(child_pid(tmp_path))


def test_command_owns_identity_flags() -> None:
    cmd = server_command(
        Path("/v/bin/python"), model=Path("/m"), served_model_name="tiny", port=9,
        api_key="k", args=["--max-num-seqs", "8"],
    )  # fmt: skip
    assert cmd[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--port") + 1] == "9"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert "--enforce-eager" in cmd
    assert cmd[-2:] == ["--max-num-seqs", "8"]
    for flag in ("--port", "--api-key=x", "--host", "--model", "--enforce-eager"):
        with pytest.raises(ValueError, match="must not set"):
            server_command(Path("p"), model=Path("m"), port=1, api_key="k", args=[flag, "1"])


def test_rendered_dtype_and_name_win_over_defaults() -> None:
    rendered = ["--served-model-name", "pool-model", "alias", "--dtype", "float32", "--max-num-seqs", "4"]
    cmd = server_command(Path("p"), model=Path("m"), port=1, api_key="k", args=rendered)
    assert cmd.count("--dtype") == cmd.count("--served-model-name") == 1
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd[-len(rendered) :] == rendered
    # Without them in the pool args, the handle supplies its defaults.
    bare = server_command(Path("p"), model=Path("m"), port=1, api_key="k", args=["--dtype=float16"])
    assert bare[bare.index("--served-model-name") + 1] == "tiny"
    assert "--dtype" not in bare and bare[-1] == "--dtype=float16"
    assert server_command(Path("p"), model=Path("m"), port=1, api_key="k", args=[], dtype="float32")[-3:] == [
        "tiny", "--dtype", "float32",
    ]  # fmt: skip
    # Asking the handle for something the pool does not declare is a mistake, not a silent pick.
    with pytest.raises(ValueError, match="--dtype float32"):
        server_command(Path("p"), model=Path("m"), port=1, api_key="k", args=rendered, dtype="bfloat16")
    with pytest.raises(ValueError, match="--served-model-name pool-model"):
        server_command(Path("p"), model=Path("m"), port=1, api_key="k", args=rendered, served_model_name="x")


def test_extra_keys_follow_the_api_key(tmp_path: Path) -> None:
    server = VllmServer(
        venv=tmp_path, model=tmp_path / "m", port=5, api_key="own", extra_api_keys=("shared",),
        workdir=tmp_path, cache=tmp_path, args=["--served-model-name", "pool-model", "alias"],
    )  # fmt: skip
    cmd = list(server.command)
    assert cmd[cmd.index("--api-key") + 1 : cmd.index("--api-key") + 3] == ["own", "shared"]
    assert server.served_model_name == "pool-model"


def test_env_is_offline_and_pinned(tmp_path: Path) -> None:
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/repo", "HOME": "/h"}
    env = server_env(base, venv=tmp_path / "v", cache=tmp_path / "c", core=1, kv_cache_gib=1)
    assert "PYTHONPATH" not in env
    assert env["PATH"].startswith(str(tmp_path / "v" / "bin"))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "c"))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_env(
        base, venv=tmp_path, cache=tmp_path, core=None, kv_cache_gib=1
    )
