"""The router's per-request work with its sockets: the real server (the router's own HTTP server
under uvloop, as `lane-router serve` runs it, every feature of the peers benchmark on) in this
process, the zero-delay fake backend and a closed-loop client in child processes, so an
instruction counter that does not follow children sees the HTTP server, the app and the upstream
client together — what router/lab/bench/hotpath.py leaves out.

    python -m router.lab.bench.wirepath whole 1          # compile the sources first
    valgrind --tool=callgrind --trace-children=no python -m router.lab.bench.wirepath whole 200
    valgrind --tool=callgrind --trace-children=no python -m router.lab.bench.wirepath whole 2200

The difference of the two totals over 2000 is the cost of one request (both runs pay start-up,
the first connections and the first 200 requests alike). `stream` asks for 64 SSE tokens per
request instead of a whole answer. A third argument sets the client's connections (default 1:
one request at a time, so every request takes the same path through the loop; with more, reads
batch by the timing of the run). The backend's health is probed once, at start-up, only. Run as
a file with `PYTHONPATH=TREE` to measure another tree of the router (the backend and the client
still come from this file's tree).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import uvloop

from router import httpserver
from router.config.load import parse_profile
from router.lab.bench.peers.targets import lane_router_profile
from router.lab.procs import child_process, free_ports
from router.server import build_app, server_config
from router.settings import Settings

KEY = "wirepath-key"
TOKENS = 64  # per streamed request
_WAIT_READY = (
    "import sys; from router.lab.bench.peers.harness import wait_ready; "
    "wait_ready(int(sys.argv[1]), sys.argv[2], None)"
)


def _client(port: int, n: int, stream: bool, concurrency: int) -> list[str]:
    args = [sys.executable, "-m", "router.lab.bench.peers.loadgen", "--port", str(port), "--key", KEY]
    args += ["--max-requests", str(n), "--concurrency", str(concurrency), "--duration", "86400"]
    args += ["--timeout", "120", "--tokens", str(TOKENS if stream else 16)]
    return [*args, "--stream"] if stream else args


async def _serve(
    app: object, settings: Settings, sock: socket.socket, client: list[str]
) -> dict[str, object]:
    """Serve on `sock` until the client has sent its requests, then stop as a signal would."""
    server = asyncio.ensure_future(httpserver.serve(app, server_config(settings), sock=sock))
    proc = await asyncio.create_subprocess_exec(*client, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    os.kill(os.getpid(), signal.SIGTERM)
    await server
    result: dict[str, object] = json.loads(out)
    return result


def run(n: int, stream: bool, concurrency: int) -> dict[str, object]:
    backend, port = free_ports(2)
    profile = lane_router_profile(f"http://127.0.0.1:{backend}", KEY)
    profile["health"] = {"interval_s": 3600}
    # Under an instruction counter a request runs some 50 times slower than natively: long enough
    # for the handler's disconnect watch to start, which natively it never does for these
    # requests, and more often the more loaded the machine. Out of reach, the count is the same
    # however loaded the machine is (each request still enters and leaves the watch list).
    profile["slow_clients"] = {"watch_disconnect_after_s": 60}
    settings = Settings(config=None, port=port, log_level="warning", watch_config=False)
    here = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(here)}
    backend_cmd = [sys.executable, "-m", "router.lab.bench.zero_backend", "--port", str(backend)]
    with child_process(backend_cmd, env=env):
        # Waited for by a child: a polling loop here would count a varying number of tries.
        subprocess.run([sys.executable, "-c", _WAIT_READY, str(backend), KEY], env=env, check=True)
        app = build_app(settings, parse_profile(profile))
        with socket.create_server(("127.0.0.1", port), backlog=4096) as sock:
            return uvloop.run(_serve(app, settings, sock, _client(port, n, stream, concurrency)))


def main(argv: list[str]) -> int:
    stream, n = argv[0] == "stream", int(argv[1])
    concurrency = int(argv[2]) if len(argv) > 2 else 1
    began = time.process_time()
    result = run(n, stream, concurrency)
    spent = time.process_time() - began
    print(f"{argv[0]}: {json.dumps(result)}; {spent / n * 1e6:.1f} µs CPU per request, start-up included")
    if result.get("requests") != n or result.get("errors") or result.get("bad_counts"):
        print("the client did not get every answer: the totals do not measure N requests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
