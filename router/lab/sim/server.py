"""The simulator's HTTP surface: a lean pure-ASGI app with vLLM's routes and `--api-key` rules.

vLLM checks its API key only on paths under /v1 (and /v2, /inference, /cohere); every other
route, including /invocations which serves full inference, is open. The simulator reproduces
that hole on purpose so the router's own boundary can be tested against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from router.app.asgi import Receive, Scope, Send, answer_lifespan
from router.errors import BadRequest, NotFound, RouterError
from router.lab.sim.protocol import (
    ChunkWriter,
    GenerationRequest,
    Kind,
    full_response,
    output_text,
    parse_generation,
    vllm_error_body,
)
from router.lab.sim.request import new_request
from router.lab.sim.runner import EngineRunner, TokenStream
from router.lab.sim.token_ids import chat_token_ids, detokenize, text_token_ids

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_METRICS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """`lora_modules`: the LoRA adapters served from the start (`--lora-modules name=path`);
    `runtime_lora`: `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` are served, as
    vLLM serves them under `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`."""

    served_model_names: tuple[str, ...] = ("sim-model",)
    api_key: str | None = None
    lora_modules: tuple[tuple[str, str], ...] = ()
    runtime_lora: bool = False


async def _respond(
    send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = _JSON
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _read_json(receive: Receive) -> Any:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("client went away")
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from exc


class SimApp:
    """One simulated vLLM server in front of one engine runner."""

    def __init__(self, runner: EngineRunner, settings: ServerSettings) -> None:
        self.runner = runner
        self.settings = settings
        self._ids = itertools.count()
        self._prefix = os.urandom(4).hex()
        # The adapters served now, name → path; an adapter answers as the base model does.
        self.adapters: dict[str, str] = dict(settings.lora_modules)
        self._routes: dict[str, tuple[tuple[str, ...], Handler]] = {
            "/health": (("GET",), self._health),
            "/ping": (("GET", "POST"), self._health),
            "/version": (("GET",), self._version),
            "/load": (("GET",), self._load),
            "/metrics": (("GET",), self._metrics),
            "/kv_event_sources": (("GET",), self._kv_event_sources),
            "/openapi.json": (("GET",), self._openapi),
            "/tokenize": (("POST",), self._tokenize),
            "/detokenize": (("POST",), self._detokenize),
            "/v1/models": (("GET",), self._models),
            "/v1/chat/completions": (("POST",), self._chat),
            "/v1/completions": (("POST",), self._completions),
            "/invocations": (("POST",), self._invocations),
        }
        if settings.runtime_lora:
            self._routes["/v1/load_lora_adapter"] = (("POST",), self._load_lora)
            self._routes["/v1/unload_lora_adapter"] = (("POST",), self._unload_lora)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except RouterError as err:
            await _respond(send, err.status, vllm_error_body(err), [*_JSON, *err.headers()])

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        guarded = self.settings.api_key and method != "OPTIONS" and path.startswith(PROTECTED_PREFIXES)
        if guarded and not self._authorized(scope):
            await _respond(send, 401, b'{"error":"Unauthorized"}')
            return
        route = self._routes.get(path)
        if route is None:
            await _respond(send, 404, b'{"detail":"Not Found"}')
            return
        methods, handler = route
        if method not in methods:
            await _respond(send, 405, b'{"detail":"Method Not Allowed"}')
            return
        await handler(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        key = self.settings.api_key or ""
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, b"Bearer " + key.encode())
        return False

    # ---- small routes ------------------------------------------------------------------------
    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 200, b"", [])

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 200, orjson.dumps({"version": self.runner.engine.config.version}))

    async def _load(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 200, orjson.dumps({"server_load": self.runner.in_flight}))

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        text = self.runner.engine.render_metrics(self.settings.served_model_names[0])
        await _respond(send, 200, text.encode(), _METRICS)

    async def _kv_event_sources(self, scope: Scope, receive: Receive, send: Send) -> None:
        # vLLM lists its publisher per data-parallel rank; the simulator is rank 0.
        publisher = self.runner.kv_publisher
        sources = {} if publisher is None else {"0": publisher.config.model_dump(mode="json")}
        await _respond(send, 200, orjson.dumps(sources))

    async def _openapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        paths: dict[str, dict[str, dict[str, str]]] = {
            p: {m.lower(): {} for m in methods} for p, (methods, _) in self._routes.items()
        }
        doc = {"openapi": "3.1.0", "info": {"title": "vLLM simulator", "version": "0.1.0"}, "paths": paths}
        await _respond(send, 200, orjson.dumps(doc))

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        now = int(time.time())
        max_len = self.runner.engine.config.max_model_len
        data = [
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": name,
                "parent": None,
                "max_model_len": max_len,
            }
            for name in self.settings.served_model_names
        ]
        parent = self.settings.served_model_names[0]
        data += [
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": path,
                "parent": parent,
                "max_model_len": None,
            }
            for name, path in self.adapters.items()
        ]
        await _respond(send, 200, orjson.dumps({"object": "list", "data": data}))

    async def _load_lora(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's checks, in its order: both fields, no base model's name, not loaded yet."""
        body = await _read_json(receive)
        name = body.get("lora_name") if isinstance(body, Mapping) else None
        path = body.get("lora_path") if isinstance(body, Mapping) else None
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise BadRequest("Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.settings.served_model_names:
            raise BadRequest(f"The lora adapter '{name}' conflicts with a served base model.")
        if name in self.adapters and not body.get("load_inplace"):
            raise BadRequest(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True."
            )
        self.adapters[name] = path
        await _respond(send, 200, f"Success: LoRA adapter '{name}' added successfully.".encode(), [])

    async def _unload_lora(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_json(receive)
        name = body.get("lora_name") if isinstance(body, Mapping) else None
        if not isinstance(name, str) or not name:
            raise BadRequest("'lora_name' needs to be provided to unload a LoRA adapter.")
        if self.adapters.pop(name, None) is None:
            raise NotFound(f"The lora adapter '{name}' cannot be found.")
        await _respond(send, 200, f"Success: LoRA adapter '{name}' removed successfully.".encode(), [])

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_json(receive)
        messages = body.get("messages") if isinstance(body, Mapping) else None
        if isinstance(messages, list) and all(isinstance(m, Mapping) for m in messages):
            ids = chat_token_ids(messages)
        elif isinstance(body, Mapping) and isinstance(body.get("prompt"), str):
            ids = text_token_ids(body["prompt"])
        else:
            raise BadRequest("'prompt' (string) or 'messages' is required.")
        max_len = self.runner.engine.config.max_model_len
        await _respond(
            send,
            200,
            orjson.dumps({"count": len(ids), "max_model_len": max_len, "tokens": ids, "token_strs": None}),
        )

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_json(receive)
        tokens = body.get("tokens") if isinstance(body, Mapping) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BadRequest("'tokens' must be a list of integers.")
        await _respond(send, 200, orjson.dumps({"prompt": detokenize(tokens)}))

    # ---- generation --------------------------------------------------------------------------
    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, "chat", await _read_json(receive))

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, "completion", await _read_json(receive))

    async def _invocations(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_json(receive)
        if isinstance(body, Mapping) and "messages" in body:
            await self._generate(scope, receive, send, "chat", body)
        elif isinstance(body, Mapping) and "prompt" in body:
            await self._generate(scope, receive, send, "completion", body)
        else:
            raise BadRequest("Cannot tell the request type: expected 'messages' or 'prompt'.")

    async def _generate(self, scope: Scope, receive: Receive, send: Send, kind: Kind, body: Any) -> None:
        loop = asyncio.get_running_loop()
        arrival = loop.time()
        engine = self.runner.engine
        parsed = parse_generation(
            body,
            kind,
            served_models=(*self.settings.served_model_names, *self.adapters),
            max_model_len=engine.config.max_model_len,
            priority_enabled=engine.config.scheduling_policy == "priority",
        )
        await self.runner.admit(len(parsed.prompt_token_ids))
        base = _header(scope, b"x-request-id") or f"{self._prefix}{next(self._ids):x}"
        engine_id = f"{base}-{next(self._ids):x}"
        req = new_request(
            engine_id,
            parsed.prompt_token_ids,
            max_tokens=parsed.max_tokens,
            min_tokens=parsed.min_tokens,
            ignore_eos=parsed.ignore_eos,
            seed=parsed.seed,
            priority=parsed.priority,
            arrival_time=arrival,
            cache_salt=parsed.cache_salt,
        )
        stream = self.runner.submit(req)  # Unavailable (503) before any byte is sent
        watcher = loop.create_task(self._watch_disconnect(receive, engine_id))
        response_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + base
        try:
            if parsed.stream:
                await self._stream(send, stream, parsed, response_id)
            else:
                await self._complete(send, stream, parsed, response_id)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.runner.abort(engine_id)  # no-op when it finished

    async def _watch_disconnect(self, receive: Receive, engine_id: str) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.runner.abort(engine_id)

    async def _stream(
        self, send: Send, stream: TokenStream, parsed: GenerationRequest, response_id: str
    ) -> None:
        req = stream.request
        writer = ChunkWriter(parsed.kind, response_id, parsed.model, int(time.time()))
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        sent = 0
        while True:
            await stream.wait(sent)
            if req.finish_reason == "abort":
                return
            n = stream.delivered
            if n > sent:
                finish = req.finish_reason if stream.done else None
                body = writer.text(output_text(req.seed, sent, n), finish)
                if sent == 0 and parsed.kind == "chat":
                    body = writer.role() + body
                sent = n
                await send({"type": "http.response.body", "body": body, "more_body": True})
            if stream.done:
                tail = writer.done()
                if parsed.include_usage:
                    tail = writer.usage(req.num_prompt_tokens, sent) + tail
                await send({"type": "http.response.body", "body": tail, "more_body": False})
                return

    async def _complete(
        self, send: Send, stream: TokenStream, parsed: GenerationRequest, response_id: str
    ) -> None:
        req = stream.request
        while not stream.done:
            await stream.wait(stream.delivered)
        if req.finish_reason == "abort":
            return
        body = full_response(
            parsed.kind,
            response_id,
            parsed.model,
            int(time.time()),
            output_text(req.seed, 0, stream.delivered),
            req.finish_reason or "length",
            req.num_prompt_tokens,
            stream.delivered,
        )
        await _respond(send, 200, body)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None
