"""The non-streamed scenario's client when wrk is installed: it costs far less CPU per request
than any Python client, so the backend and the proxy, not the client, set the rate.

wrk sends the same request bytes as `loadgen` (a Lua script sets method, body and headers)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from router.lab.bench.peers.scenarios import MODEL, Load

_REQUESTS = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b")
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def write_script(path: Path, key: str, tokens: int) -> Path:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say something short."}],
            "max_tokens": tokens,
            "stream": False,
        },
        separators=(",", ":"),
    )
    path.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    return path


def command(wrk: str, port: int, concurrency: int, duration_s: int, script: Path) -> list[str]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return [wrk, "-t1", f"-c{concurrency}", f"-d{duration_s}s", "--timeout", "5s", "-s", str(script), url]


def parse(output: str) -> Load:
    """wrk's summary as a Load (wrk counts every answer as a request; non-2xx are errors)."""
    found = _REQUESTS.search(output)
    if found is None:
        raise RuntimeError(f"no wrk summary in: {output[-500:]!r}")
    total, elapsed = int(found.group(1)), float(found.group(2)) * _UNIT_S[found.group(3)]
    bad = _NON_2XX.search(output)
    failed = int(bad.group(1)) if bad else 0
    sockets = _SOCKET.search(output)
    socket_errors = sum(int(n) for n in sockets.groups()) if sockets else 0
    return Load(
        requests=total - failed,
        chunks=0,
        errors=failed + socket_errors,
        bad_counts=0,
        elapsed_s=elapsed,
        client="wrk",
    )


def run(cmd: list[str], duration_s: int) -> Load:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 30, check=True)
    return parse(done.stdout)
