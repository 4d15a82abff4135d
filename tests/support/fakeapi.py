"""The fake backend's answers on vLLM's other client routes, shaped as vLLM 0.32 shapes them:
the Responses API with responses stored in this server's memory (a `previous_response_id` it
does not hold is vLLM's 404), retrieve and cancel, rerank, score, tokenize, detokenize, and
the audio routes (their multipart body read with the form reader vLLM's audio routes use).

Each answer names the server (`tag`) and, for responses, how many turns the conversation had,
so a test sees which server held a conversation from the answers alone."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from router.app.asgi import Message, Scope, Send

ROUTES = frozenset(
    {"/v1/responses", "/rerank", "/score", "/tokenize", "/detokenize", "/v1/audio/transcriptions",
     "/v1/audio/translations"}
)  # fmt: skip


@dataclass
class Upload:
    """What an audio request carried: its form fields and the sha256 of its file."""

    fields: dict[str, str]
    file_sha256: str
    file_size: int


@dataclass
class FakeApi:
    tag: str = "fake"
    itl_s: float = 0.0
    stored: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # id → (turns, response)
    uploads: list[Upload] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)  # every body chunk of the last streamed answer
    report_usage: bool = True  # False: responses carry `"usage": null`
    create_status: int = 200  # another: a new response is refused with it (retrieves still answer)
    tokenize_status: int = 200  # another: /tokenize answers it (a server that cannot count)
    tokenize_count: int | None = None  # set: /tokenize answers this count (a server that miscounts)
    _next: int = 0

    @staticmethod
    def serves(path: str) -> bool:
        return path in ROUTES or path.startswith("/v1/responses/")

    async def answer(self, scope: Scope, body: bytes, watcher: asyncio.Future[None], send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path.startswith("/v1/responses/"):
            await self._stored(path, method, send)
        elif path == "/v1/responses":
            await self._responses(orjson.loads(body), watcher, send)
        elif path.startswith("/v1/audio/"):
            await self._audio(scope, body, send)
        elif path == "/tokenize" and self.tokenize_status != 200:
            await respond(
                send, self.tokenize_status, b'{"error":{"message":"cannot count","code":"scripted"}}'
            )
        elif path == "/tokenize" and self.tokenize_count is not None:
            await respond(send, 200, orjson.dumps({"count": self.tokenize_count, "max_model_len": 2048}))
        else:
            await respond(send, 200, orjson.dumps(_pooling(path, orjson.loads(body))))

    async def _responses(self, request: dict[str, Any], watcher: asyncio.Future[None], send: Send) -> None:
        if self.create_status != 200:
            await respond(
                send, self.create_status, b'{"error":{"message":"scripted failure","code":"scripted"}}'
            )
            return
        turns, history = 1, 0
        previous = request.get("previous_response_id")
        if previous is not None:
            if previous not in self.stored:
                await respond(send, 404, _not_found(previous))
                return
            turns = self.stored[previous][0] + 1
            history = self.stored[previous][1]["usage"]["total_tokens"]
        self._next += 1
        # As vLLM: the body's request_id names the response (a stored one of that id is replaced,
        # unless the request says `store: false`).
        rid = request.get("request_id") or f"resp_{self.tag}{self._next:06x}"
        text = f"turn {turns} on {self.tag}"
        response = _response(rid, request, text, previous, history)
        if request.get("store", True) is not False:
            self.stored[rid] = (turns, response)
        if not self.report_usage:
            response = {**response, "usage": None}
        if not request.get("stream"):
            await respond(send, 200, orjson.dumps(response))
            return
        await self._stream(response, text, watcher, send)

    async def _stream(
        self, response: dict[str, Any], text: str, watcher: asyncio.Future[None], send: Send
    ) -> None:
        self.sent = []
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        created = {**response, "status": "in_progress", "output": []}
        events = [("response.created", {"response": created})]
        events += [("response.output_text.delta", {"delta": word + " "}) for word in text.split()]
        events.append(("response.completed", {"response": response}))
        for seq, (kind, data) in enumerate(events):
            if seq and self.itl_s:
                done, _ = await asyncio.wait([watcher], timeout=self.itl_s)
                if done:
                    raise asyncio.CancelledError
            chunk = b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(
                {"type": kind, "sequence_number": seq, **data}
            ) + b"\n\n"  # fmt: skip
            self.sent.append(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stored(self, path: str, method: str, send: Send) -> None:
        rid = path.removeprefix("/v1/responses/").removesuffix("/cancel")
        found = self.stored.get(rid)
        if found is None:
            await respond(send, 404, _not_found(rid))
        elif method == "POST":
            await respond(send, 200, orjson.dumps({**found[1], "status": "cancelled"}))
        else:
            await respond(send, 200, orjson.dumps(found[1]))

    async def _audio(self, scope: Scope, body: bytes, send: Send) -> None:
        fields: dict[str, str] = {}
        data = b""
        try:
            form = await _vllm_form(scope, body)
        except MultiPartException as exc:
            await respond(send, 400, orjson.dumps({"error": {"message": exc.message, "code": 400}}))
            return
        try:
            for name, value in form.multi_items():
                if isinstance(value, UploadFile):
                    data = await value.read()
                else:
                    fields[name] = value  # the last one wins, as vLLM's request model takes it
        finally:
            await form.close()
        self.uploads.append(Upload(fields, hashlib.sha256(data).hexdigest(), len(data)))
        answer = {
            "text": f"heard {len(data)} bytes on {self.tag}",
            "usage": {"type": "duration", "seconds": 1},
        }
        await respond(send, 200, orjson.dumps(answer))


async def _vllm_form(scope: Scope, body: bytes) -> FormData:
    """The form as vLLM's audio routes read it: Starlette's `Request.form()`."""

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    # Without an app in the scope, a malformed form raises MultiPartException (vLLM's 400).
    return await Request({"type": "http", "headers": scope["headers"]}, receive).form()


def _response(
    rid: str, request: dict[str, Any], text: str, previous: str | None, history: int
) -> dict[str, Any]:
    """vLLM's response object; its input tokens count the conversation it continues, as vLLM
    renders the whole conversation again."""
    words = len(text.split())
    prompt = history + 4
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "model": request.get("model"),
        "status": "completed",
        "previous_response_id": previous,
        "max_output_tokens": request.get("max_output_tokens"),
        "output": [
            {
                "type": "message",
                "id": "msg_" + rid[5:],
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "output_tokens": words,
            "total_tokens": prompt + words,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _not_found(rid: str) -> bytes:
    return orjson.dumps(
        {"error": {"message": f"Response with id '{rid}' not found.", "type": "NotFoundError", "code": 404}}
    )


def _overlap(a: str, b: str) -> float:
    left, right = set(a.lower().split()), set(b.lower().split())
    return len(left & right) / max(1, len(left | right))


# The fake server's chat template: 4 tokens of turn markers a message, 2 of generation prompt.
TURN_TOKENS = 4
GENERATION_TOKENS = 2


def text_tokens(text: str) -> int:
    """The fake server's tokenizer: a token per ASCII word, one per other character."""
    ascii_words = "".join(c if c.isascii() else " " for c in text).split()
    return len(ascii_words) + sum(1 for c in text if not c.isascii())


def chat_tokens(messages: list[dict[str, Any]]) -> int:
    """What the fake server's /tokenize counts for a chat: its template around each message."""
    count = GENERATION_TOKENS
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        count += TURN_TOKENS + text_tokens(message["role"]) + text_tokens(text)
    return count


def _pooling(path: str, request: dict[str, Any]) -> dict[str, Any]:
    model = request.get("model")
    if path == "/tokenize":
        if "messages" in request:
            count = chat_tokens(request["messages"])
            return {"count": count, "max_model_len": 2048, "tokens": list(range(count))}
        tokens = list(str(request.get("prompt", "")).encode())
        return {"count": len(tokens), "max_model_len": 2048, "tokens": tokens}
    if path == "/detokenize":
        return {"prompt": bytes(request["tokens"]).decode("utf-8", "replace")}
    if path == "/rerank":
        docs = request["documents"]
        scored = sorted(((i, _overlap(request["query"], d)) for i, d in enumerate(docs)), key=lambda x: -x[1])
        results = [{"index": i, "document": {"text": docs[i]}, "relevance_score": s} for i, s in scored]
        return {
            "id": "rerank-fake",
            "model": model,
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
            "results": results,
        }
    queries = request.get("queries", request.get("text_1"))
    items = request.get("documents", request.get("items", request.get("text_2")))
    query = queries if isinstance(queries, str) else queries[0]
    docs = items if isinstance(items, list) else [items]
    data = [{"index": i, "object": "score", "score": _overlap(query, d)} for i, d in enumerate(docs)]
    return {"id": "score-fake", "object": "list", "model": model, "data": data, "usage": {"prompt_tokens": 8}}


async def respond(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
