"""The router's per-request work with its sockets: the real server (the router's own HTTP server
under uvloop, as `lane-router serve` runs it, every feature of the peers benchmark on) in this
process, the zero-delay fake backend and a closed-loop client in child processes, so an
instruction counter that does not follow children sees the HTTP server, the app and the upstream
client together — what router/lab/bench/hotpath.py leaves out.

    python -m router.lab.bench.wirepath whole 1          # write the bytecode caches first
    valgrind --tool=callgrind --trace-children=no python -m router.lab.bench.wirepath whole 200
    valgrind --tool=callgrind --trace-children=no python -m router.lab.bench.wirepath whole 2200

The difference of the two totals over 2000 is the cost of one request (both runs pay start-up,
the first connections and the first 200 requests alike). A run's start-up moves by millions of
instructions from run to run; the event loop's inclusive count (`callgrind_annotate
--inclusive=yes OUT | grep 'Loop__run '`) leaves the imports out and differences more steadily.
`stream` asks for 64 SSE tokens per request instead of a whole answer. A third argument sets the
client's connections (default 1: one request at a time, so every request takes the same path
through the loop; with more, reads batch by the timing of the run). The backend's health is
probed once, at start-up, only. Run as a file with `PYTHONPATH=TREE` to measure another tree of
the router (the backend and the client still come from this file's tree).

`paced` streams as `stream` does, but as a paced backend (vLLM) does: each of the 65 writes of
a response's body (64 tokens, then `[DONE]` with the body's end) reaches the router alone, in a
read of its own. The backend writes the next one only once the client has acknowledged the
last (router/lab/bench/zero_backend.py `--lockstep-fd`), over a socket pair between the two
children, so it holds whatever the timing; its one connection is checked by `gaps` in the
result, the token gaps the router timed, one per read after a response's first (64 each).
Per read, then: (paced − whole) / 65. Some of a stream's work still goes by the clock (the
client's lag is sampled every LAG_CHECK_S, router/lanes/slowclient.py; the client's next request may
come before or after the last one's task has finished): one tree's paced count moves by a few
percent from run to run on a busy machine. Compare two trees by runs made side by side, over a
wide N2 − N1.
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
from typing import Any

import uvloop

from router import httpserver
from router.config.load import parse_profile
from router.lab.bench.peers.targets import lane_router_profile
from router.lab.procs import child_process, free_ports
from router.observe.metrics import Metrics
from router.server import build_app, server_config
from router.settings import Settings

KEY = "wirepath-key"
TOKENS = 64  # per streamed request
MODES = ("whole", "stream", "paced")
_WAIT_READY = (
    "import sys; from router.lab.bench.peers.harness import wait_ready; "
    "wait_ready(int(sys.argv[1]), sys.argv[2], None)"
)


def _client(port: int, n: int, stream: bool, concurrency: int, ack_fd: int | None) -> list[str]:
    args = [sys.executable, "-m", "router.lab.bench.peers.loadgen", "--port", str(port), "--key", KEY]
    args += ["--max-requests", str(n), "--concurrency", str(concurrency), "--duration", "86400"]
    args += ["--timeout", "120", "--tokens", str(TOKENS if stream else 16)]
    if ack_fd is not None:
        args += ["--ack-fd", str(ack_fd)]
    return [*args, "--stream"] if stream else args


async def _serve(
    app: Any, settings: Settings, sock: socket.socket, client: list[str], pass_fds: tuple[int, ...]
) -> dict[str, object]:
    """Serve on `sock` until the client has sent its requests, then stop as a signal would."""
    server = asyncio.ensure_future(httpserver.serve(app, server_config(settings), sock=sock))
    proc = await asyncio.create_subprocess_exec(*client, stdout=asyncio.subprocess.PIPE, pass_fds=pass_fds)
    out, _ = await proc.communicate()
    os.kill(os.getpid(), signal.SIGTERM)
    await server
    result: dict[str, object] = json.loads(out)
    result["gaps"] = _gaps_timed(app.state.metrics)
    return result


def _gaps_timed(metrics: Metrics) -> int:
    """The token gaps the router timed: one per body read of a stream after its first."""
    counts = (s.value for m in metrics.itl.collect() for s in m.samples if s.name.endswith("_count"))
    return int(sum(counts))


def run(n: int, stream: bool, concurrency: int, paced: bool = False) -> dict[str, object]:
    if paced and (not stream or concurrency != 1):
        raise ValueError("paced streams run one at a time")
    backend_end, client_end = socket.socketpair() if paced else (None, None)
    try:
        return _run(n, stream, concurrency, backend_end, client_end)
    finally:
        for end in (backend_end, client_end):
            if end is not None:
                end.close()


def _run(
    n: int,
    stream: bool,
    concurrency: int,
    backend_end: socket.socket | None,
    client_end: socket.socket | None,
) -> dict[str, object]:
    backend, port = free_ports(2)
    profile = lane_router_profile(f"http://127.0.0.1:{backend}", KEY)
    profile["health"] = {"interval_s": 3600}
    # The profile's disconnect watch as `serve` runs it: the router's own server tells the relay
    # of a lost client itself, so a request costs the same however slowly it runs (under another
    # ASGI server a watch task would start once it had run the profile's delay, and under an
    # instruction counter every request runs that long).
    settings = Settings(config=None, port=port, log_level="warning", watch_config=False)
    here = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(here)}
    backend_cmd = [sys.executable, "-m", "router.lab.bench.zero_backend", "--port", str(backend)]
    backend_fds = _fds(backend_end)
    if backend_end is not None:
        backend_cmd += ["--lockstep-fd", str(backend_end.fileno())]
    ack_fd = client_end.fileno() if client_end is not None else None
    client = _client(port, n, stream, concurrency, ack_fd)
    with child_process(backend_cmd, env=env, pass_fds=backend_fds):
        # Waited for by a child: a polling loop here would count a varying number of tries.
        subprocess.run([sys.executable, "-c", _WAIT_READY, str(backend), KEY], env=env, check=True)
        app = build_app(settings, parse_profile(profile))
        with socket.create_server(("127.0.0.1", port), backlog=4096) as sock:
            return uvloop.run(_serve(app, settings, sock, client, _fds(client_end)))


def _fds(end: socket.socket | None) -> tuple[int, ...]:
    return () if end is None else (end.fileno(),)


def main(argv: list[str]) -> int:
    mode, n = argv[0], int(argv[1])
    if mode not in MODES:
        print(f"the mode is one of {', '.join(MODES)}", file=sys.stderr)
        return 2
    concurrency = int(argv[2]) if len(argv) > 2 else 1
    began = time.process_time()
    result = run(n, mode != "whole", concurrency, paced=mode == "paced")
    spent = time.process_time() - began
    print(f"{argv[0]}: {json.dumps(result)}; {spent / n * 1e6:.1f} µs CPU per request, start-up included")
    if result.get("requests") != n or result.get("errors") or result.get("bad_counts"):
        print("the client did not get every answer: the totals do not measure N requests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
