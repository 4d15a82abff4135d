"""`lane-router demo` prints a key made for its run, and that key works while the demo runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from router.lab.procs import stop

KEY_LINE = re.compile(r"^key for this run \(gone when the demo stops\): (lr-[A-Za-z0-9_-]{43})$")
CURL_LINE = re.compile(r'^  curl -H "Authorization: Bearer (\S+)" (http://127\.0\.0\.1:\d+)/v1/models$')


def demo_key_while_running(out: Path) -> tuple[str, int, int]:
    """Run the demo; once it prints its key, ask its router for /v1/models with that key and with
    the old published one. Returns the key and both statuses."""
    argv = [sys.executable, "-m", "router", "demo", "--rate", "2", "--duration", "3", "--no-progress"]
    proc = subprocess.Popen([*argv, "--out", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = iter(proc.stdout.readline, "")
        key_match = next(m for m in map(KEY_LINE.match, (line.rstrip("\n") for line in lines)) if m)
        curl = CURL_LINE.match(next(lines).rstrip("\n"))
        assert curl is not None and curl.group(1) == key_match.group(1)
        url = curl.group(2)
        mine = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {curl.group(1)}"}, timeout=5)
        old = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer demo-key"}, timeout=5)
        proc.stdout.read()
        assert proc.wait(120) == 0
    finally:
        stop(proc)
    return key_match.group(1), mine.status_code, old.status_code


@pytest.mark.timeout(300)
def test_each_demo_run_prints_a_fresh_key_that_its_router_accepts(tmp_path: Path) -> None:
    first, mine, old = demo_key_while_running(tmp_path / "first.jsonl")
    second, _, _ = demo_key_while_running(tmp_path / "second.jsonl")

    assert (mine, old) == (200, 401)
    assert first != second
