"""`lane-router serve` with a key anyone can use: refused beyond loopback, a warning on it; and
a reload that would bring one in is refused on a router listening beyond loopback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.config.load import parse_profile
from router.keys.auth import hash_key, new_key
from router.observe.metrics import Metrics
from router.state.live import RouterState
from router.state.runtime import build_runtime
from tests.support.processes import stop
from tests.support.profiles import profile
from tests.support.servers import free_port

ADMIN_KEY = new_key()
DEMO = {"name": "demo", "sha256": hash_key("demo-key"), "may_set_class": True}
START_TIMEOUT_S = 30.0


def clean_profile(name: str = "clean") -> dict[str, Any]:
    """A valid profile whose only key is a fresh admin key (its backend need not answer)."""
    data = profile(["http://127.0.0.1:9"], profile=name)
    data["keys"] = [{"name": "ops", "sha256": hash_key(ADMIN_KEY), "admin": True}]
    return data


def with_keys(*keys: dict[str, Any], name: str = "clean") -> dict[str, Any]:
    data = clean_profile(name)
    data["keys"] += list(keys)
    return data


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def serve_argv(path: Path, host: str, port: int) -> list[str]:
    options = ["--config", str(path), "--host", host, "--port", str(port)]
    return [sys.executable, "-m", "router", "serve", *options]


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "LANE_ROUTER_WATCH_CONFIG": "false", **extra}


@contextlib.contextmanager
def running(path: Path, host: str, log: Path, env: dict[str, str]) -> Iterator[str]:
    """`serve` until the block ends; yields its loopback URL once /health answers."""
    port = free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(serve_argv(path, host, port), env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, proc, log)
        yield url
    finally:
        stop(proc)


def _wait_health(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"serve did not answer /health within {START_TIMEOUT_S:g} s: {log.read_text()}")


def run_serve(path: Path, host: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = serve_argv(path, host, free_port())
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


# --- serve --------------------------------------------------------------------------------------


def test_serve_refuses_to_listen_beyond_loopback_with_a_published_key(tmp_path: Path) -> None:
    path = write(tmp_path / "profile.yaml", with_keys(DEMO, {"name": "filler", "sha256": "0" * 64}))

    done = run_serve(path, "0.0.0.0", child_env())

    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("lane-router serve: refusing to listen on '0.0.0.0', beyond loopback")
    assert lines[1].startswith("  keys[1].sha256: key 'demo' is the sha256 of 'demo-key'")
    assert lines[2].startswith("  keys[2].sha256: key 'filler' is a placeholder")
    assert len(lines) == 3 and all("lane-router hash-key --new" in line for line in lines[1:])


def test_serve_checks_environment_keys_on_their_values(tmp_path: Path) -> None:
    data = with_keys({"name": "web", "sha256_env": "WEB_KEY_SHA256"})
    path = write(tmp_path / "profile.yaml", data)

    done = run_serve(path, "0.0.0.0", child_env(WEB_KEY_SHA256=hash_key("EMPTY")))

    assert done.returncode == 2, done.stderr
    assert "  keys[1].sha256_env: key 'web': $WEB_KEY_SHA256 holds the sha256 of 'EMPTY'" in done.stderr


def test_serve_starts_on_loopback_with_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path / "profile.yaml", with_keys(DEMO))
    log = tmp_path / "serve.log"

    with running(path, "127.0.0.1", log, child_env()) as url:
        models = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer demo-key"}, timeout=5)

    assert models.status_code == 200
    text = log.read_text()
    assert "WARNING" in text and "keys[1].sha256: key 'demo' is the sha256 of 'demo-key'" in text


def test_serve_listens_beyond_loopback_with_random_keys(tmp_path: Path) -> None:
    path = write(tmp_path / "profile.yaml", clean_profile())
    log = tmp_path / "serve.log"

    with running(path, "0.0.0.0", log, child_env()) as url:
        lanes = httpx.get(f"{url}/admin/lanes", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=5)

    assert lanes.status_code == 200 and lanes.json()["profile"] == "clean"
    assert "anyone can use" not in log.read_text()


# --- reload -------------------------------------------------------------------------------------


def test_admin_reload_bringing_in_a_published_key_is_refused_beyond_loopback(tmp_path: Path) -> None:
    path = write(tmp_path / "profile.yaml", clean_profile())
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}

    with running(path, "0.0.0.0", tmp_path / "serve.log", child_env()) as url:
        write(path, with_keys(DEMO, name="with-demo"))
        resp = httpx.post(f"{url}/admin/reload", headers=admin, timeout=10)
        demo = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer demo-key"}, timeout=5)
        lanes = httpx.get(f"{url}/admin/lanes", headers=admin, timeout=5)

    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["profile"] == "clean"
    [issue] = body["issues"]
    assert issue["path"] == "keys[1].sha256" and "'demo-key'" in issue["message"]
    assert demo.status_code == 401
    assert lanes.json()["profile"] == "clean"


@contextlib.asynccontextmanager
async def reloading(tmp_path: Path, bind_host: str) -> AsyncIterator[tuple[RouterState, Path]]:
    """A router's state on `clean_profile()` from a file, as `serve` on `bind_host` builds it."""
    path = write(tmp_path / "profile.yaml", clean_profile())
    metrics = Metrics()
    state = RouterState(
        build_runtime(parse_profile(clean_profile()), metrics), metrics, path, bind_host=bind_host
    )
    try:
        yield state, path
    finally:
        await state.aclose()


async def test_a_reload_beyond_loopback_keeps_the_old_profile(tmp_path: Path) -> None:
    async with reloading(tmp_path, "0.0.0.0") as (state, path):
        write(path, with_keys({"name": "filler", "sha256": "deadbeef" * 8}, name="with-filler"))

        outcome = await state.reload("SIGHUP")

        assert not outcome.ok and outcome.profile == "clean"
        assert [i.path for i in outcome.issues] == ["keys[1].sha256"]
        assert "keys[1].sha256: key 'filler' is a placeholder" in outcome.reason
        assert state.runtime.config.profile == "clean"


async def test_a_reload_checks_environment_keys_on_their_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with reloading(tmp_path, "10.1.2.3") as (state, path):
        monkeypatch.setenv("WEB_KEY_SHA256", hash_key("token-abc123"))
        write(path, with_keys({"name": "web", "sha256_env": "WEB_KEY_SHA256"}, name="with-web"))

        refused = await state.reload("file change")
        monkeypatch.setenv("WEB_KEY_SHA256", hash_key(new_key()))
        accepted = await state.reload("file change")

        assert [i.path for i in refused.issues] == ["keys[1].sha256_env"] and not refused.ok
        assert accepted.ok and state.runtime.config.profile == "with-web"


async def test_a_reload_on_loopback_takes_the_key_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with reloading(tmp_path, "127.0.0.1") as (state, path):
        write(path, with_keys(DEMO, name="with-demo"))

        outcome = await state.reload("admin request")

        assert outcome.ok and state.runtime.config.profile == "with-demo"
        assert "keys[1].sha256: key 'demo' is the sha256 of 'demo-key'" in caplog.text
