"""The proxy tests' backend: a minimal OpenAI-compatible server with scripted timing and failures.

A test scripts a failure on cue — answer 503, stall before the first byte, die mid-stream — and
the backend records what reached it, so a test can prove that something was — or was not —
forwarded, and when the router let go of a request. A stream that asks for it
(`stream_options.include_usage`) ends with vLLM's usage event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from router.app.asgi import Receive, Scope, Send, answer_lifespan, receive_body
from tests.support import anthropicapi
from tests.support.fakeapi import FakeApi


@dataclass
class Behaviour:
    """How the backend answers; tests change it between requests."""

    tokens: int = 16
    ttft_s: float = 0.0
    itl_s: float = 0.0
    status: int = 200
    hang_before_headers: bool = False
    die_after_tokens: int | None = None
    keepalive_comment_every: int = 0
    model: str = "fake-model"
    version: str = "0.32.0"
    honor_max_tokens: bool = False
    # When set, a generation waits for it before answering: the test decides how long a request
    # holds its slot, whatever the machine's speed.
    hold: asyncio.Event | None = None
    # When set, a whole answer reports this JSON as its usage (a backend that miscounts).
    reported_usage: bytes | None = None


@dataclass
class Seen:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    started: float
    finished: float | None = None
    disconnected: float | None = None


@dataclass
class FakeBackend:
    behaviour: Behaviour = field(default_factory=Behaviour)
    seen: list[Seen] = field(default_factory=list)
    record: bool = True
    healthy: bool = True
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    api: FakeApi = field(default_factory=FakeApi)  # vLLM's other client routes (tests/support/fakeapi.py)
    # LoRA adapters /v1/models lists (name → path), with the model as their parent; a load
    # (`POST /v1/load_lora_adapter`) adds one unless `lora_load_status` says otherwise, after
    # `lora_load_hold` is set when a test holds it.
    adapters: dict[str, str] = field(default_factory=dict)
    lora_loads: list[dict[str, str]] = field(default_factory=list)
    lora_load_auth: list[str | None] = field(default_factory=list)  # each load's authorization
    lora_load_status: int = 200
    lora_load_hold: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = await receive_body(receive)
        path, method = scope["path"], scope["method"]
        if path == "/health":
            await _respond(send, 200 if self.healthy else 503, b"{}")
            return
        if path == "/v1/models":
            await _respond(send, 200, _models(self.behaviour.model, self.adapters))
            return
        if path == "/v1/load_lora_adapter" and method == "POST":
            self.lora_load_auth.append(_headers(scope).get("authorization"))
            await self._load_lora(send, body)
            return
        if path == "/version":
            await _respond(send, 200, orjson.dumps({"version": self.behaviour.version}))
            return
        item = Seen(path, method, _headers(scope), body, time.monotonic())
        if self.record:
            self.seen.append(item)
            self._notify()
        try:
            if self.api.serves(path):
                await self._api(scope, receive, send, body)
            elif path in anthropicapi.MESSAGES_PATHS:
                await self._messages(path, receive, send, body)
            else:
                await self._generate(receive, send, body)
            item.finished = time.monotonic()
        except asyncio.CancelledError:
            item.disconnected = time.monotonic()
            raise
        finally:
            self._notify()

    async def _load_lora(self, send: Send, body: bytes) -> None:
        request = orjson.loads(body)
        self.lora_loads.append(request)
        self._notify()
        if self.lora_load_hold is not None:
            await self.lora_load_hold.wait()
        name = request["lora_name"]
        if self.lora_load_status != 200:
            message = b'{"error":{"message":"scripted load failure","code":%d}}' % self.lora_load_status
            await _respond(send, self.lora_load_status, message)
        elif name in self.adapters:
            await _respond(send, 400, b'{"error":{"message":"The lora adapter has already been loaded."}}')
        else:
            self.adapters[name] = request["lora_path"]
            await _respond(send, 200, b"Success")
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `predicate()` holds, woken by each change instead of polling on a timer."""
        async with asyncio.timeout(timeout):
            while not predicate():
                await self.changed.wait()

    async def _api(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        if self.behaviour.status != 200:
            await _respond(
                send, self.behaviour.status, b'{"error":{"message":"scripted failure","code":"scripted"}}'
            )
            return
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await self.api.answer(scope, body, watcher, send)
        finally:
            watcher.cancel()

    async def _messages(self, path: str, receive: Receive, send: Send, body: bytes) -> None:
        """Anthropic's Messages API as vLLM answers it (tests/support/anthropicapi.py): the
        behaviour's tokens, at most `max_tokens`, its timing and scripted failures."""
        b = self.behaviour
        request = orjson.loads(body)
        if b.status != 200:
            await _respond(send, b.status, anthropicapi.error(b.status))
            return
        if path.endswith("/count_tokens"):
            await _respond(send, 200, anthropicapi.count(request))
            return
        tokens = min(b.tokens, request["max_tokens"])
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        try:
            if b.hold is not None:
                await _until_first(watcher, b.hold)
            if not request.get("stream"):
                await _respond(send, 200, anthropicapi.message(request, b.model, tokens))
                return
            start = {"type": "http.response.start", "status": 200}
            await send({**start, "headers": [(b"content-type", b"text/event-stream")]})
            await send(
                {
                    "type": "http.response.body",
                    "body": anthropicapi.stream_head(request, b.model),
                    "more_body": True,
                }
            )
            for i in range(tokens):
                if i and b.itl_s:
                    await _sleep_unless(watcher, b.itl_s)
                if b.die_after_tokens is not None and i == b.die_after_tokens:
                    raise ConnectionAbortedError("scripted death mid-stream")
                await send(
                    {"type": "http.response.body", "body": anthropicapi.stream_token(i), "more_body": True}
                )
            tail = anthropicapi.stream_tail(request, tokens)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            watcher.cancel()

    async def _generate(self, receive: Receive, send: Send, body: bytes) -> None:
        b = self.behaviour
        if b.hang_before_headers:
            await _until_disconnect(receive)
            raise asyncio.CancelledError
        if b.status != 200:
            await _respond(send, b.status, b'{"error":{"message":"scripted failure","code":"scripted"}}')
            return
        request = orjson.loads(body) if body else {}
        tokens = b.tokens
        if b.honor_max_tokens and isinstance(request.get("max_tokens"), int):
            tokens = request["max_tokens"]
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        try:
            if b.hold is not None:
                await _until_first(watcher, b.hold)
            if request.get("stream"):
                await self._stream(send, watcher, tokens, _wants_usage(request))
            else:
                await self._whole(send, watcher, tokens)
        finally:
            watcher.cancel()

    async def _whole(self, send: Send, watcher: asyncio.Future[None], tokens: int) -> None:
        # Like vLLM, a request whose client went away is aborted even when not streaming.
        b = self.behaviour
        if b.ttft_s:
            await _sleep_unless(watcher, b.ttft_s + b.itl_s * max(0, tokens - 1))
        text = " tok" * tokens
        payload = orjson.dumps(
            {
                "id": "cmpl-fake",
                "object": "chat.completion",
                "model": b.model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1},
            }
        )
        if b.reported_usage is not None:
            payload = payload[: payload.rindex(b',"usage":')] + b',"usage":' + b.reported_usage + b"}"
        await _respond(send, 200, payload)

    async def _stream(self, send: Send, watcher: asyncio.Future[None], tokens: int, usage: bool) -> None:
        b = self.behaviour
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        if b.ttft_s:
            await _sleep_unless(watcher, b.ttft_s)
        for i in range(tokens):
            if i and b.itl_s:
                await _sleep_unless(watcher, b.itl_s)
            if b.die_after_tokens is not None and i == b.die_after_tokens:
                raise ConnectionAbortedError("scripted death mid-stream")
            if b.keepalive_comment_every and i and i % b.keepalive_comment_every == 0:
                await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": _token_event(i, b.model), "more_body": True})
        if usage:
            await send(
                {"type": "http.response.body", "body": _usage_event(tokens, b.model), "more_body": True}
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _token_event(i: int, model: str) -> bytes:
    chunk = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _wants_usage(request: dict[str, object]) -> bool:
    options = request.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _usage_event(tokens: int, model: str) -> bytes:
    usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
    chunk = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def _sleep_unless(watcher: asyncio.Future[None], delay: float) -> None:
    done, _ = await asyncio.wait([watcher], timeout=delay)
    if done:
        raise asyncio.CancelledError


async def _until_first(watcher: asyncio.Future[None], hold: asyncio.Event) -> None:
    """Wait until the test lets the request go; a client that leaves first aborts it."""
    released = asyncio.ensure_future(hold.wait())
    try:
        await asyncio.wait([watcher, released], return_when=asyncio.FIRST_COMPLETED)
    finally:
        released.cancel()
    if watcher.done():
        raise asyncio.CancelledError


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _models(model: str, adapters: dict[str, str]) -> bytes:
    data = [{"id": model, "object": "model", "owned_by": "fake", "max_model_len": 2048, "parent": None}]
    data += [{"id": a, "object": "model", "root": p, "parent": model} for a, p in adapters.items()]
    return orjson.dumps({"object": "list", "data": data})
