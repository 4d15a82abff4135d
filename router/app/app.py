"""The router's ASGI application: a fixed route table, the error mapping, and the lifespan that
runs health probes and reload triggers.

Routes match the raw request path byte for byte. Only the allowlisted OpenAI routes are
proxied, and the path sent upstream is the router's own constant, never the client's text:
`//v1/…`, `/v1/../invocations`, `/V1/…` or percent-encoded variants match nothing and get 404."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from router.app import admin
from router.app.asgi import Message, Receive, Send, body_writer, send_bytes, send_json
from router.app.routes import PROXIED, stored_route
from router.errors import LengthRequired, MethodNotAllowed, NotFound, RouterError, Unauthorized
from router.observe.metrics import CONTENT_TYPE
from router.proxy.handler import handle
from router.proxy.intake import ClientGone, Headers
from router.proxy.respond import ResponseAborted
from router.proxy.stored import handle_stored
from router.state.live import RouterState
from router.state.runtime import Runtime

Handler = Callable[[RouterState, Message, Receive, Send], Awaitable[None]]

log: Final = logging.getLogger("lane_router.app")


async def _health(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    await send_json(send, 200, {"status": "ok"})


async def _ready(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    ready = state.runtime.ready()
    await send_json(send, 200 if ready else 503, {"status": "ready" if ready else "not_ready"})


async def _metrics(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    key = state.runtime.keys.authenticate(Headers(scope["headers"]).authorization)
    key.allow_metrics()
    await send_bytes(send, 200, state.metrics.exposition(), CONTENT_TYPE.encode())


async def _models(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    runtime = state.runtime
    key = runtime.keys.authenticate(Headers(scope["headers"]).authorization)
    # Every name the pools serve that the key may use; as vLLM lists them, an adapter names its
    # model as its `parent`.
    data = [
        {
            "id": model,
            "object": "model",
            "owned_by": "lane-router",
            "created": int(runtime.loaded_at),
            "max_model_len": min(p.max_model_len for p in pools),
            "root": pools[0].config.model,
            "parent": pools[0].config.model if model in pools[0].config.adapters else None,
        }
        for model, pools in sorted(runtime.models.items())
        if key.models is None or model in key.models
    ]
    await send_json(send, 200, {"object": "list", "data": data})


@dataclass(frozen=True, slots=True)
class OnRuntime:
    """A route served on the runtime current at its start, held until it ends, so a reload
    drains what the old runtime started. `LaneRouterApp` holds the runtime itself: a coroutine
    wrapping the route's would add a frame to every resume of the request."""

    serve: Callable[[Runtime, Any, Message, Receive, Send], Awaitable[None]]
    route: Any  # what `serve` takes: the proxied route's API, or the stored response's route


Route = Handler | OnRuntime


def _stored_methods(path: bytes) -> dict[str, Route] | None:
    """The handlers of the stored response's route `path` names exactly, if one does."""
    stored = stored_route(path)
    return None if stored is None else {stored.method: OnRuntime(handle_stored, stored)}


ROUTES: Final[dict[bytes, dict[str, Route]]] = {
    b"/health": {"GET": _health, "HEAD": _health},
    b"/ready": {"GET": _ready, "HEAD": _ready},
    b"/metrics": {"GET": _metrics},
    b"/v1/models": {"GET": _models},
    b"/admin/lanes": {"GET": admin.lanes},
    b"/admin/reload": {"POST": admin.reload},
    **{path: {"POST": OnRuntime(handle, api)} for path, api in PROXIED.items()},
}


def _chunked(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"transfer-encoding" for name, _ in headers)


class LaneRouterApp:
    def __init__(self, state: RouterState, lifespan: Callable[[], Any] | None = None) -> None:
        self.state = state
        self._lifespan = lifespan

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._run_lifespan(receive, send)
            return
        # Requests are served in this coroutine, not in one of their own: the request's task
        # resumes through one frame fewer at every await.
        # Every RouterError is raised before a response starts: failures after the first byte
        # are answered in-stream by the relay, or end as ResponseAborted. Any other exception is
        # the server's to report: logged once, a 500 if nothing was sent yet, else the
        # connection is dropped (router/httpserver/dispatch.py).
        try:
            if body_writer(scope) is None and _chunked(scope["headers"]):
                # Another server may have put the trailer's fields among the head's (uvicorn's
                # httptools protocol does), where the key and class are read from. The router's
                # own reads the head alone (router/httpserver/reader.py).
                raise LengthRequired("send the request body with a Content-Length, not in chunks")
            path = scope.get("raw_path") or scope["path"].encode()
            # The fixed routes looked up here, not in a call: they take every proxied request.
            methods = ROUTES.get(path) or _stored_methods(path)
            if methods is None:
                raise NotFound("unknown route", code="unknown_route")
            handler = methods.get(scope["method"])
            if handler is None:
                raise MethodNotAllowed(
                    f"use {' or '.join(methods)} on this route", headers={"allow": ", ".join(methods)}
                )
            if isinstance(handler, OnRuntime):
                runtime = self.state.runtime
                runtime.enter()
                try:
                    await handler.serve(runtime, handler.route, scope, receive, send)
                finally:
                    runtime.leave()
            else:
                await handler(self.state, scope, receive, send)
        except ClientGone:
            return
        except RouterError as err:
            self._count(err)
            await send_json(send, err.status, err.envelope(), err.headers())
        except ResponseAborted as err:
            log.warning(
                "%s %s: response cut short, dropping the client connection: %s",
                scope["method"],
                scope["path"],
                err,
            )
            raise

    def _count(self, err: RouterError) -> None:
        m = self.state.metrics
        if isinstance(err, Unauthorized) or err.code.endswith("scope_required"):
            m.auth_failures.labels(err.code).inc()
        else:
            m.rejected.labels(err.code).inc()

    async def _run_lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        context = self._lifespan() if self._lifespan else None
        try:
            if context is not None:
                await context.__aenter__()
        except Exception as exc:
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        # Not `finally`: compiled, an await there re-raises an exception its caller is handling
        # (docs/compiled.md, "What a compiled module must not do").
        try:
            if context is not None:
                await context.__aexit__(None, None, None)
        except BaseException as exc:
            await send({"type": "lifespan.shutdown.complete"})
            raise exc  # named, not bare: docs/compiled.md
        await send({"type": "lifespan.shutdown.complete"})
