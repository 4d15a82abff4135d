"""The admin API: what each lane and backend is doing, and reload on demand (admin scope)."""

from __future__ import annotations

from typing import Any

from router.asgi import Message, Receive, Send, send_json
from router.errors import RouterError
from router.proxy.handler import Headers
from router.runtime import Pool, Runtime
from router.state import RouterState


class ReloadRefused(RouterError):
    status = 422
    type = "invalid_request_error"
    code = "invalid_config"


def lanes_report(runtime: Runtime) -> dict[str, Any]:
    return {
        "profile": runtime.config.profile,
        "ready": runtime.ready(),
        "lanes": {
            lane.name: {
                "pool": lane.pool.name,
                "balance": lane.config.balance.strategy,
                "priority": lane.config.priority,
                "max_in_flight": lane.config.max_in_flight,
                "in_flight": lane.in_flight,
                "decouple": lane.config.decouple,
            }
            for lane in runtime.lanes.values()
        },
        "pools": {name: _pool_report(pool) for name, pool in runtime.pools.items()},
    }


def _pool_report(pool: Pool) -> dict[str, Any]:
    return {
        "model": pool.config.model,
        "server_configuration_hash": pool.config_hash,
        "vllm_version": pool.config.vllm.version,
        "max_model_len": pool.config.vllm.max_model_len,
        "backends": [
            {
                "url": b.name,
                "health": b.health.value,
                "in_flight": b.in_flight,
                "prefilling": b.prefilling,
                "drift": list(b.drift),
            }
            for b in pool.backends
        ],
    }


def _admin(state: RouterState, scope: Message) -> None:
    state.runtime.keys.authenticate(Headers(scope["headers"]).authorization).allow_admin()


async def lanes(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    _admin(state, scope)
    await send_json(send, 200, lanes_report(state.runtime))


async def reload(state: RouterState, scope: Message, receive: Receive, send: Send) -> None:
    _admin(state, scope)
    outcome = await state.reload("admin request")
    if not outcome.ok:
        err = ReloadRefused(outcome.reason)
        payload: dict[str, Any] = err.envelope()
        payload["issues"] = [{"path": i.path, "message": i.message} for i in outcome.issues]
        payload["profile"] = outcome.profile
        await send_json(send, err.status, payload)
        return
    await send_json(send, 200, {"result": "reloaded", "profile": outcome.profile})
