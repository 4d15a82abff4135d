"""The overhead benchmark's upstream: an OpenAI-compatible chat endpoint that answers at once, or
paced (a fixed time to the first token and between tokens), in a process of its own.

It does no work beyond writing vLLM-shaped bytes (router/lab/sim/protocol.py), so what the
benchmark measures between the direct and the routed path is the router's own cost.

    python -m router.lab.bench.zero_backend --port PORT [--ttft-ms 20 --itl-ms 5]
    python -m router.lab.bench.zero_backend --port PORT --lockstep-fd FD

In lockstep a stream's every write waits for one byte on the socket FD, which the client sends
when it received the response's head and each token: each write then reaches the proxy alone,
in a read of its own, however fast or loaded the machine is (router/lab/bench/wirepath.py
`paced`). It serves one stream at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from router.app.asgi import Receive, Scope, Send, answer_lifespan, receive_body, send_bytes, send_json
from router.lab.sim.protocol import ChunkWriter, full_response

MODEL = "fake-model"
VERSION = "0.32.0"
MAX_MODEL_LEN = 2048


@dataclass(frozen=True, slots=True)
class Pace:
    tokens: int = 16  # when the request sets no max_tokens
    ttft_s: float = 0.0
    itl_s: float = 0.0


class ZeroBackend:
    def __init__(self, pace: Pace, lockstep: socket.socket | None = None) -> None:
        self.pace = pace
        self.lockstep = lockstep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = await receive_body(receive)
        path = scope["path"]
        if path == "/health":
            await send_json(send, 200, {})
        elif path == "/version":
            await send_json(send, 200, {"version": VERSION})
        elif path == "/v1/models":
            model = {"id": MODEL, "object": "model", "owned_by": "lab", "max_model_len": MAX_MODEL_LEN}
            await send_json(send, 200, {"object": "list", "data": [model]})
        else:
            await self._complete(send, orjson.loads(body) if body else {})

    async def _complete(self, send: Send, request: dict[str, object]) -> None:
        max_tokens = request.get("max_tokens")
        tokens = max_tokens if isinstance(max_tokens, int) else self.pace.tokens
        if request.get("stream"):
            await self._stream(send, tokens)
            return
        if self.pace.ttft_s:
            await asyncio.sleep(self.pace.ttft_s + self.pace.itl_s * max(0, tokens - 1))
        text = " tok" * tokens
        payload = full_response("chat", "chatcmpl-zero", MODEL, int(time.time()), text, "length", 1, tokens)
        await send_bytes(send, 200, payload, b"application/json")

    async def _stream(self, send: Send, tokens: int) -> None:
        writer = ChunkWriter("chat", "chatcmpl-zero", MODEL, int(time.time()))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        if self.pace.ttft_s:
            await asyncio.sleep(self.pace.ttft_s)
        for i in range(tokens):
            if i and self.pace.itl_s:
                await asyncio.sleep(self.pace.itl_s)
            await self._step()
            await send({"type": "http.response.body", "body": writer.text(f" t{i}"), "more_body": True})
        await self._step()
        await send({"type": "http.response.body", "body": writer.done(), "more_body": False})

    async def _step(self) -> None:
        """In lockstep, until the client has what was written before."""
        if self.lockstep is not None and not await asyncio.get_running_loop().sock_recv(self.lockstep, 1):
            raise ConnectionError("the lockstep socket closed")


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m router.lab.bench.zero_backend", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--tokens", type=int, default=16, help="tokens when the request sets no max_tokens")
    parser.add_argument("--lockstep-fd", type=int, help="a socket: one byte per write a stream may make")
    args = parser.parse_args(argv)
    pace = Pace(tokens=args.tokens, ttft_s=args.ttft_ms / 1000, itl_s=args.itl_ms / 1000)
    lockstep = None
    if args.lockstep_fd is not None:
        lockstep = socket.socket(fileno=args.lockstep_fd)
        lockstep.setblocking(False)
    uvicorn.run(
        ZeroBackend(pace, lockstep),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
