"""A stand-in for `python -m vllm.entrypoints.openai.api_server`, for testing the process handle.

FAKE_VLLM_MODE selects the behaviour: ``ok`` serves /health and starts a child in its process
group (as vLLM starts its engine), ``crash`` exits at once, ``stubborn`` ignores SIGTERM,
``silent`` never answers /health.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# An engine child that ignores SIGTERM: only a group SIGKILL removes it.
CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    print(f"fake vllm mode={mode} argv={sys.argv[1:]}", flush=True)
    if mode == "crash":
        print("RuntimeError: engine core failed to start", flush=True)
        return 3
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    Path(os.environ["FAKE_VLLM_CHILD_PID_FILE"]).write_text(str(child.pid))
    if mode == "silent":
        signal.pause()
        return 0
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Health)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else _exit)
    server.serve_forever()
    return 0


def _exit(signum: int, frame: object) -> None:
    # Like an API server that exits on SIGTERM without waiting for its engine child.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
