"""From vLLM URLs to a served request: `lane-router init` asks the real servers, `check` accepts
what it wrote, and `lane-router serve` on that file answers a chat request with the printed key —
every step through the command line, as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from router.keys.auth import hash_key
from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MAX_MODEL_LEN, MODEL_NAME, SHARED_KEY
from tests.support.servers import free_port

# Start-up of the session's servers counts against the first test run; a busy host needs longer.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
READY_WITHIN_S = 60.0


def lane_router(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )


def wait_ready(proc: subprocess.Popen[str], url: str) -> None:
    """Poll the router's /ready until it answers 200: it listens and every lane has a healthy backend."""
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "lane-router serve exited"
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"lane-router serve not ready within {READY_WITHIN_S:.0f}s")


def test_init_from_the_servers_checks_and_serves_with_the_printed_key(
    real_pools: RealPools, tmp_path: Path
) -> None:
    env = {**os.environ, "VLLM_KEY": SHARED_KEY}
    out = tmp_path / "lane-router.yaml"
    urls = [real_pools.interactive.url, real_pools.batch.url]

    init = lane_router("init", *urls, "--output", str(out), "--backend-api-key-env", "VLLM_KEY", env=env)
    assert init.returncode == 0, init.stderr
    key = init.stdout.strip()
    text = out.read_text()
    assert key not in text and SHARED_KEY not in text and hash_key(key) in text
    data = yaml.safe_load(text)
    [(name, pool)] = data["pools"].items()
    assert pool["model"] == MODEL_NAME and pool["backends"] == urls
    assert pool["vllm"]["max_model_len"] == MAX_MODEL_LEN and pool["upstream_api_key_env"] == "VLLM_KEY"
    assert "lanes" not in data

    check = lane_router("check", "--config", str(out), env=env)
    assert check.returncode == 0, check.stderr
    assert f"one pool, {name!r}" in check.stdout

    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "router", "serve", "--config", str(out), "--port", str(port)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(serve, url)
        chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
        answer = httpx.post(
            url + "/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key}"}, timeout=120
        )
        refused = httpx.post(url + "/v1/chat/completions", json=chat, timeout=30)
    finally:
        serve.terminate()
        _, log = serve.communicate(timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    assert answer.json()["usage"]["completion_tokens"] >= 1
    assert refused.status_code == 401
    assert "drift" not in log.lower(), log  # the profile states what the servers run
    assert "HTTP Request" not in log, log  # health probes stay out of the log at INFO
